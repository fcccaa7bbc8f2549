#!/usr/bin/env node
// The `parley` command. It runs dist/parley.mjs, the server bundled by `npm run build` (npm ci,
// npm start and npm test build it), when that is newer than every source file; otherwise the
// TypeScript sources through tsx's loader. Either way in this same process (no child), so
// signals and the embedded-database lock see one pid.
import { existsSync, readdirSync, statSync } from 'node:fs'
import { join } from 'node:path'

const root = join(import.meta.dirname, '..')
const bundle = join(root, 'dist', 'parley.mjs')

function newestSource (dir) {
  let newest = 0
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name)
    newest = Math.max(newest, entry.isDirectory() ? newestSource(path) : statSync(path).mtimeMs)
  }
  return newest
}

let main
if (existsSync(bundle) && statSync(bundle).mtimeMs >= newestSource(join(root, 'src'))) {
  ({ main } = await import(bundle))
} else {
  const { register } = await import('tsx/esm/api')
  register()
  ;({ main } = await import('../src/cli.ts'))
}
process.exitCode = await main(process.argv.slice(2))
