import type { Socket } from 'node:net'
import { setImmediate } from 'node:timers/promises'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { RateLimited } from '../errors.js'
import { Abandoned, FairGate, QueueFull } from '../fair-gate.js'
import type { Metrics } from '../metrics.js'
import { principalOf } from './auth.js'

/**
 * How a route is admitted. `request` (the default): one of the key's few places for work on
 * the database. `heavy`: work whose cost grows with its input (a 1,000-member group, a search,
 * a conversation list): one at a time per key, and at most half the pool over all keys.
 * `transfer`: downloads, which read a chunk per query for as long as the client takes, so they
 * are capped per key only (uploads, multipart sends, take the same places before their body is
 * read). `none`: routes that wait rather than work (long-polls, streams), capped on their own.
 */
type Admission = 'request' | 'heavy' | 'transfer' | 'none'

declare module 'fastify' {
  interface FastifyContextConfig {
    admission?: Admission
  }
  interface FastifyInstance {
    /**
     * For a route admitted `none` that works only part of the time (a long-poll reads, waits,
     * reads): waits for a place at the gate and resolves with the way to give it back. The
     * caller must call it when its work is done (in a finally): the response's close does not,
     * since the work may go on after it. Throws 429 like the gates' own hook.
     */
    admit(req: FastifyRequest, reply: FastifyReply, kind: Exclude<Admission, 'none'>): Promise<() => void>
  }
}

export interface AdmissionOptions {
  /** Database connections this process has (pg's pool; 1 for PGlite). */
  poolSize: number
  metrics: Metrics
}

/** Requests one key may have waiting at one gate; past it 429, at once. */
const MAX_QUEUED_PER_KEY = 64

const ABANDONED = 'The request was abandoned by its client before its turn'

/** What each gate admits, from the pool size: documented in docs/security.md. */
function admissionLimits (poolSize: number) {
  return {
    // Every database request: a third of the pool per key (at least 2), so three keys at full
    // tilt still leave connections for a fourth.
    requestPerKey: Math.max(2, Math.ceil(poolSize / 3)),
    // Expensive work: half the pool over all keys (at least 1), one per key.
    heavyCapacity: Math.max(1, Math.floor(poolSize / 2)),
    heavyPerKey: 1,
    // Uploads and downloads, which hold a connection a chunk at a time.
    transfersPerKey: 2
  }
}

/**
 * Fair admission of database work between API keys. Each request waits its key's turn before
 * its handler runs (uploads: before their body is read), holding no connection while it waits,
 * so one key's backlog can take at most its share of the pool and never the whole of it; the
 * pool's own queue (and its 503 after 5 s) is left for real overload.
 */
export const admissionPlugin = fp(async (app: FastifyInstance, opts: AdmissionOptions) => {
  const limits = admissionLimits(opts.poolSize)
  const gates = {
    request: new FairGate({ capacity: Infinity, perKey: limits.requestPerKey, maxQueuedPerKey: MAX_QUEUED_PER_KEY }),
    heavy: new FairGate({ capacity: limits.heavyCapacity, perKey: limits.heavyPerKey, maxQueuedPerKey: MAX_QUEUED_PER_KEY }),
    transfer: new FairGate({ capacity: Infinity, perKey: limits.transfersPerKey, maxQueuedPerKey: MAX_QUEUED_PER_KEY })
  }
  opts.metrics.gauge('parley_admission', 'Requests holding a place (held) or waiting for one (waiting), per gate', () =>
    Object.entries(gates).flatMap(([gate, g]) => {
      const { held, waiting } = g.stats()
      return [{ labels: { gate, state: 'held' }, value: held }, { labels: { gate, state: 'waiting' }, value: waiting }]
    }))

  /**
   * Whether the client has gone: its response closed, or its socket was reset or half-closed
   * (Node aborts a half-closed connection's requests: no answer can reach it any more).
   */
  const clientGone = (req: FastifyRequest, reply: FastifyReply): boolean => {
    // Compared with true and false: app.inject's stand-in socket has neither property.
    const socket = req.raw.socket as Socket | null
    return reply.raw.closed || socket === null || socket.destroyed === true || socket.writable === false
  }

  /**
   * Waits the key's turn at `gate`. A client that leaves while it waits, or before it is let
   * in, gets nothing done (429 to a closed socket): it never starts work it cannot be told of.
   */
  async function pass (req: FastifyRequest, reply: FastifyReply, gate: FairGate): Promise<() => void> {
    let leave: () => void
    let abandon: (() => void) | undefined
    try {
      // The response's close: the client went away (the request's own close fires as soon as
      // its body is read, so it cannot tell).
      leave = await gate.enter(principalOf(req).keyId, (cancel) => { abandon = cancel; reply.raw.once('close', cancel) })
    } catch (err) {
      if (err instanceof QueueFull) throw new RateLimited()
      if (err instanceof Abandoned) throw new RateLimited(ABANDONED)
      throw err
    } finally {
      // Taken off once settled: a long-poll passes several times and must not pile up listeners.
      if (abandon !== undefined) reply.raw.off('close', abandon)
    }
    // A hang-up is seen only once the event loop reads the socket: on PGlite, whose queries run
    // on the loop's own thread, hang-ups pile up unread behind one long statement. Two turns of
    // the loop (the second after a poll for I/O) let them be read before the work starts.
    await setImmediate()
    await setImmediate()
    if (clientGone(req, reply)) {
      leave()
      throw new RateLimited(ABANDONED)
    }
    return leave
  }

  // Places taken before the handler (an upload's, before its body is read), and whether the
  // handler has started: then the place is the handler's to give back, however the client goes.
  const uploads = new WeakMap<FastifyRequest, { leave: () => void, handled: boolean }>()

  // For routes admitted `none` that work only part of the time (long-polls, streams): each
  // read passes the gate like a request and gives its place back when done.
  app.decorate('admit', async (req: FastifyRequest, reply: FastifyReply, kind: Exclude<Admission, 'none'>) => pass(req, reply, gates[kind]))

  // Uploads queue before their bytes are read, so a key's many large sends do not all stream at once.
  app.addHook('preParsing', async (req, reply) => {
    if (req.is404 || req.routeOptions.config.public === true || req.routeOptions.config.acceptsFiles !== true) return
    if (!/^\s*multipart\//i.test(req.headers['content-type'] ?? '')) return
    const upload = { leave: await pass(req, reply, gates.transfer), handled: false }
    uploads.set(req, upload)
    // Refused while streaming (too large, malformed, the client gone): no handler will run.
    reply.raw.once('close', () => { if (!upload.handled) upload.leave() })
  })

  // The place is held by the handler itself, from its start to its end: not by the socket, so a
  // client that hangs up frees nothing its handler still uses (connections, locks), and the
  // gate's count is the truth. The answer's flush holds none: it is built by then.
  app.addHook('onRoute', (route) => {
    if (route.config?.public === true) return
    const kind: Admission = route.config?.admission ?? 'request'
    if (kind === 'none') return
    const handler = route.handler
    route.handler = async function admitted (this: FastifyInstance, req: FastifyRequest, reply: FastifyReply) {
      const upload = uploads.get(req)
      if (upload !== undefined) upload.handled = true
      // Our own flag: app.inject's response never sets `closed`.
      let closed = false
      let onClose: (() => void) | undefined
      reply.raw.once('close', () => { closed = true; onClose?.() })
      let leave: (() => void) | undefined
      let answered = false
      try {
        leave = await pass(req, reply, gates[kind])
        const answer: unknown = await handler.call(this, req, reply)
        answered = true
        return answer
      } finally {
        upload?.leave()
        // A download reads a chunk per query for as long as its client takes: its place is
        // held until its stream ends, or is destroyed with its socket (per key only).
        if (kind === 'transfer' && answered && !closed) onClose = leave
        else leave?.()
      }
    }
  })
}, { name: 'parley-admission', dependencies: ['parley-auth'] })
