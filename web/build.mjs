// Builds the web console into web/dist: one bundled script, the page and its stylesheet.
// Run by `npm ci` (prepare), `npm start` and `npm test`; takes well under a second.
import { copyFileSync, mkdirSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { build } from 'esbuild'

const here = dirname(fileURLToPath(import.meta.url))
const out = join(here, 'dist')
mkdirSync(out, { recursive: true })
await build({
  entryPoints: [join(here, 'src', 'main.ts')],
  outfile: join(out, 'console.js'),
  bundle: true,
  format: 'esm',
  target: 'es2022',
  minify: true,
  sourcemap: 'linked',
  logLevel: 'warning'
})
for (const file of ['index.html', 'console.css']) copyFileSync(join(here, file), join(out, file))
