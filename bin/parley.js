#!/usr/bin/env node
// The `parley` command. It runs dist/parley.mjs, the server bundled by `npm run build` (npm ci,
// npm start and npm test build it), when that is newer than every source file; otherwise the
// TypeScript sources through tsx's loader, a development dependency — so a production install
// (`npm ci --omit=dev`, no sources or no tsx) always runs the bundle. Either way in this same
// process (no child), so signals and the embedded-database lock see one pid.
import { existsSync, readdirSync, statSync } from 'node:fs'
import { join } from 'node:path'

const root = join(import.meta.dirname, '..')
const bundle = join(root, 'dist', 'parley.mjs')

function newestSource (dir) {
  if (!existsSync(dir)) return 0
  let newest = 0
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name)
    newest = Math.max(newest, entry.isDirectory() ? newestSource(path) : statSync(path).mtimeMs)
  }
  return newest
}

async function sourcesLoader () {
  try {
    return (await import('tsx/esm/api')).register
  } catch {
    return undefined
  }
}

let main
const fresh = existsSync(bundle) && statSync(bundle).mtimeMs >= newestSource(join(root, 'src'))
const register = fresh ? undefined : await sourcesLoader()
if (register === undefined) {
  if (!existsSync(bundle)) {
    console.error('parley: dist/parley.mjs is missing; run `npm run build` (or `npm ci`, which builds it)')
    process.exit(1)
  }
  ({ main } = await import(bundle))
} else {
  register()
  ;({ main } = await import('../src/cli.ts'))
}
process.exitCode = await main(process.argv.slice(2))
