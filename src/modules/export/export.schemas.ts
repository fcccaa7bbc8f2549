import type { Readable } from 'node:stream'
import { Type } from 'typebox'
import { AddressParam, withHeaders } from '../../schemas.js'

export const ExportUserParams = Type.Object({ user: AddressParam })

/** A user's data as one zip, streamed (API.md §14). */
export const ExportArchive = withHeaders(Type.Unsafe<Readable>({
  description: 'A zip, streamed as it is read: README.txt, profile.json, roster.json, groups.json, metadata.json, ' +
    'messages.jsonl (one message a line, with statuses, edits, reactions and metadata) and attachments/<message id>/<n>-<name>',
  content: { 'application/zip': { schema: { type: 'string', format: 'binary' } } }
}), {
  'Content-Disposition': Type.String({ title: 'ExportDisposition', description: 'attachment; filename="parley-export-<address>-<date>.zip"' })
})
