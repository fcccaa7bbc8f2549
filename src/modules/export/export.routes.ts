import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import type { FastifyReply, FastifyRequest } from 'fastify'
import { ZipFile } from 'yazl'
import type { Database } from '../../db/client.js'
import { loggableError } from '../../db/errors.js'
import { NotFound, RateLimited, Unavailable } from '../../errors.js'
import { normalizeAddress } from '../../ids.js'
import { principalOf } from '../../plugins/auth.js'
import { AUTHENTICATED_ERRORS, errorResponses } from '../../schemas.js'
import { requestSource } from '../audit/audit.service.js'
import { createUsersRepository } from '../users/users.repository.js'
import { ExportArchive, ExportUserParams } from './export.schemas.js'
import { cutArchive, exportBusy, runExport } from './export.service.js'

export interface ExportRoutesOptions {
  database: Pick<Database, 'db' | 'driver'>
  /** Exports this process streams at once, over all users: each holds a connection (PostgreSQL) for its whole download. */
  maxExports: number
  /** EXPORT_MAX_SECONDS: an export still streaming after this is cut, its snapshot let go. */
  maxSeconds: number
}

const DESCRIPTION = 'A zip streamed as it is read, in constant memory: README.txt, profile.json (the user, its keys and webhooks, never ' +
  'their secrets), roster.json, groups.json, metadata.json, messages.jsonl (every message it sent or received and may still read, ' +
  'with statuses, edits, reactions and metadata) and attachments/. On PostgreSQL every file shows one moment (a snapshot); on the ' +
  'embedded database, nothing newer than the export\'s start (profile.json says which). One export per user at a time: 429 ' +
  'otherwise. Recorded in the audit log as user.export.'

/**
 * Exports (API.md §14): a user's own (`GET /export`, scope read) or any user's (`GET
 * /admin/users/{user}/export`, scope admin). The archive is written by export.service.ts; here,
 * who may have one now, the audit entry, and the snapshot held for as long as the download.
 */
export const exportRoutes: FastifyPluginAsyncTypebox<ExportRoutesOptions> = async (app, { database, maxExports, maxSeconds }) => {
  const users = createUsersRepository(database.db)
  // Users whose export this process is streaming; other instances are kept out by the
  // snapshot's advisory lock (PostgreSQL; the embedded database has one process).
  const running = new Set<string>()
  // At shutdown every export still answering is cut, as at its deadline, and no new one starts:
  // a client that stopped reading would otherwise hold close() for as long as the export may run
  // (EXPORT_MAX_SECONDS), and the process is ended 10 s after SIGTERM with the database open.
  // Each answer is in `cutters` from its start to its socket's close, past the export's own end
  // (the archive's last bytes may still wait on a client that stopped reading).
  let closing = false
  const cutters = new Set<(reason: string) => void>()
  app.addHook('preClose', async () => {
    closing = true
    for (const cut of cutters) cut('the service is shutting down')
  })

  async function exportOf (req: FastifyRequest, reply: FastifyReply, address: string, scope: 'read' | 'admin'): Promise<FastifyReply> {
    // A request admitted before the shutdown began (queued at the transfer gate, say) comes here after it.
    if (closing) throw new Unavailable('the service is shutting down; try again shortly')
    if (running.has(address)) throw exportBusy(address)
    if (running.size >= maxExports) throw new RateLimited(`${running.size} exports are running on this instance; try again shortly`)
    running.add(address)
    try {
      const zip = new ZipFile()
      const { keyId } = principalOf(req)
      // Why the export must stop, as soon as it is known: listened for from here, so a client
      // that hangs up while the snapshot is being opened is not missed (its close would have
      // fired before the export could hear it, and the archive then waited for ever on a
      // response nobody reads, holding the snapshot, the lock and its places).
      let stopWith: ((reason: string) => void) | undefined
      let stopReason: string | undefined
      const stop = (reason: string) => {
        stopReason ??= reason
        stopWith?.(stopReason)
      }
      const onClose = () => { stop('its client went away') }
      reply.raw.once('close', onClose)
      if (reply.raw.closed || req.raw.socket === null || req.raw.socket.destroyed) onClose()
      // A client that reads slowly keeps the export going, and on PostgreSQL its snapshot open:
      // whatever its pace, it ends at EXPORT_MAX_SECONDS.
      const deadline = setTimeout(() => { stop(`it ran past EXPORT_MAX_SECONDS (${maxSeconds} s)`) }, maxSeconds * 1000)
      const unwatch = app.keyWatch.watch(keyId, () => { stop(`key ${keyId} may no longer ${scope === 'read' ? 'read' : 'administer'}`) }, scope)
      let started!: () => void
      const ready = new Promise<void>((resolve) => { started = resolve })
      let ended = false
      const cut = (reason: string) => {
        stop(reason)
        if (ended) reply.raw.destroy()
      }
      if (!reply.raw.closed) {
        cutters.add(cut)
        reply.raw.once('close', () => { cutters.delete(cut) })
      }
      const work = runExport(database, address, zip, requestSource(req), (run) => {
        stopWith = (reason) => { run.abort(reason) }
        if (stopReason !== undefined) run.abort(stopReason)
        started()
      }).finally(() => {
        ended = true
        clearTimeout(deadline)
        unwatch()
        reply.raw.off('close', onClose)
      })
      await Promise.race([ready, work])
      const date = new Date().toISOString().slice(0, 10)
      void reply
        .header('content-type', 'application/zip')
        .header('content-disposition', `attachment; filename="parley-export-${address.replace(/[^a-z0-9.@+-]/g, '_')}-${date}.zip"`)
        .header('cache-control', 'private, no-store')
        .send(zip.outputStream)
      try {
        await work
      } catch (err) {
        // The answer has started: it ends short (the zip has no central directory, so no unzip
        // takes it for whole) and the cause goes to the log.
        req.log.warn({ err: loggableError(err), user: address }, 'export stopped before its end')
        cutArchive(zip, err instanceof Error ? err : new Error(String(err)))
      }
      return reply
    } finally {
      running.delete(address)
    }
  }

  app.get('/export', {
    config: { admission: 'transfer' },
    schema: {
      operationId: 'exportMine',
      tags: ['export'],
      summary: 'Export my data',
      description: DESCRIPTION,
      response: { 200: ExportArchive, ...errorResponses(...AUTHENTICATED_ERRORS) }
    }
  }, async (req, reply) => exportOf(req, reply, principalOf(req).address, 'read'))

  app.get('/admin/users/:user/export', {
    config: { admission: 'transfer' },
    schema: {
      operationId: 'adminExportUser',
      tags: ['admin'],
      summary: 'Export a user\'s data',
      description: DESCRIPTION,
      params: ExportUserParams,
      response: { 200: ExportArchive, ...errorResponses(...AUTHENTICATED_ERRORS, 403, 404) }
    }
  }, async (req, reply) => {
    const address = normalizeAddress(req.params.user)
    if (await users.find(address) === undefined) throw new NotFound('user', address)
    return exportOf(req, reply, address, 'admin')
  })
}
