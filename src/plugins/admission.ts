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
export type Admission = 'request' | 'heavy' | 'transfer' | 'none'

declare module 'fastify' {
  interface FastifyContextConfig {
    admission?: Admission
  }
  interface FastifyInstance {
    /**
     * For a route admitted `none` that works only part of the time (a long-poll reads, waits,
     * reads): waits for a place at the gate and resolves with the way to give it back, which the
     * response's close also does. Throws 429 like the gates' own hook.
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

  async function pass (req: FastifyRequest, reply: FastifyReply, gate: FairGate): Promise<void> {
    // The response's close: the answer is sent, or the client went away (the request's own
    // close fires as soon as its body is read, so it cannot tell).
    const res = reply.raw
    let leave: () => void
    try {
      leave = await gate.enter(principalOf(req).keyId, (cancel) => res.once('close', cancel))
    } catch (err) {
      if (err instanceof QueueFull) throw new RateLimited()
      if (err instanceof Abandoned) throw new RateLimited('The request was abandoned by its client while it waited its turn')
      throw err
    }
    if (res.closed) leave()
    else res.once('close', leave)
  }

  app.decorate('admit', async (req: FastifyRequest, reply: FastifyReply, kind: Exclude<Admission, 'none'>) => {
    const res = reply.raw
    let leave: () => void
    // Taken off once admitted: a long-poll admits several times and must not pile up listeners.
    let abandon: (() => void) | undefined
    try {
      leave = await gates[kind].enter(principalOf(req).keyId, (cancel) => { abandon = cancel; res.once('close', cancel) })
    } catch (err) {
      if (err instanceof QueueFull) throw new RateLimited()
      if (err instanceof Abandoned) throw new RateLimited('The request was abandoned by its client while it waited its turn')
      throw err
    } finally {
      if (abandon !== undefined) res.off('close', abandon)
    }
    if (res.closed) leave()
    else res.once('close', leave)
    // The gate's leave runs once however often it is called.
    return () => { res.off('close', leave); leave() }
  })

  const admission = (req: FastifyRequest): Admission => req.routeOptions.config.admission ?? 'request'

  // Uploads queue before their bytes are read, so a key's many large sends do not all stream at once.
  app.addHook('preParsing', async (req, reply) => {
    if (req.is404 || req.routeOptions.config.public === true || req.routeOptions.config.acceptsFiles !== true) return
    if (!/^\s*multipart\//i.test(req.headers['content-type'] ?? '')) return
    await pass(req, reply, gates.transfer)
  })
  app.addHook('preHandler', async (req, reply) => {
    if (req.is404 || req.routeOptions.config.public === true) return
    const kind = admission(req)
    if (kind === 'none') return
    await pass(req, reply, gates[kind])
  })
}, { name: 'parley-admission', dependencies: ['parley-auth'] })
