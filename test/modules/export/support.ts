import { fromBuffer, type Entry, type ZipFile } from 'yauzl'

/** An archive read back: each entry's name and bytes, in the archive's order. */
export interface Unzipped { names: string[], files: Map<string, Buffer> }

/** Opens a whole zip with yauzl (a reader that checks the central directory against the entries) and reads every entry. */
export async function unzip (zip: Buffer): Promise<Unzipped> {
  const archive = await new Promise<ZipFile>((resolve, reject) => {
    fromBuffer(zip, { lazyEntries: true, strictFileNames: true, validateEntrySizes: true }, (err, z) => { if (err !== null) reject(err); else resolve(z) })
  })
  const names: string[] = []
  const files = new Map<string, Buffer>()
  await new Promise<void>((resolve, reject) => {
    archive.on('error', reject)
    archive.on('end', () => { resolve() })
    archive.on('entry', (entry: Entry) => {
      names.push(entry.fileName)
      archive.openReadStream(entry, (err, stream) => {
        if (err !== null) { reject(err); return }
        const chunks: Buffer[] = []
        stream.on('data', (c: Buffer) => chunks.push(c))
        stream.on('error', reject)
        stream.on('end', () => { files.set(entry.fileName, Buffer.concat(chunks)); archive.readEntry() })
      })
    })
    archive.readEntry()
  })
  return { names, files }
}

/** messages.jsonl's lines as objects. */
export function messageLines (files: Map<string, Buffer>): Record<string, unknown>[] {
  return (files.get('messages.jsonl')?.toString('utf8') ?? '').split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as Record<string, unknown>)
}

/** A JSON file of the archive. */
export function json<T = unknown> (files: Map<string, Buffer>, name: string): T {
  const bytes = files.get(name)
  if (bytes === undefined) throw new Error(`${name} is not in the archive`)
  return JSON.parse(bytes.toString('utf8')) as T
}
