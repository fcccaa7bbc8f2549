// Builds what `npm start` runs: the server as one ES module (dist/parley.mjs, its packages left
// to node_modules), and the web console (web/dist: one bundled script, the page, the styles).
// Run by `npm ci` (prepare), `npm start` and `npm test`; esbuild takes well under a second.
// bin/parley.js runs the bundle when it is newer than every source file, else the sources.
// esbuild is a development dependency: a built tree installed with `npm ci --omit=dev` (a
// production image) has the bundles already and nothing to build them with, so this is a no-op.
import { copyFileSync, existsSync, mkdirSync, readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const built = ['dist/parley.mjs', 'web/dist/console.js'].every((file) => existsSync(join(root, file)))
const build = await import('esbuild').then((esbuild) => esbuild.build, (err) => {
  if (built && err.code === 'ERR_MODULE_NOT_FOUND') return undefined
  throw err
})
if (build === undefined) {
  console.log('esbuild is not installed (npm ci --omit=dev): using the bundles already built')
  process.exit(0)
}
// The server bundle targets the oldest Node.js package.json's "engines" admits (">=22.13": node22.13).
const floor = /^>=\s*(\d+(?:\.\d+)*)$/.exec(JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).engines.node)
if (floor === null) throw new Error('package.json "engines.node" must read ">=X.Y" for the build target')
const common = { bundle: true, format: 'esm', sourcemap: 'linked', logLevel: 'warning' }

// Packages stay in node_modules (PGlite and the Fastify plugins load files beside their code),
// except drizzle-orm: Node reads a package's package.json for each of its files it loads, and
// drizzle-orm's (178 KB of exports) made that ~0.9 s of CPU of every `parley` start, over half
// of `parley user list`.
const dependencies = Object.keys(JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).dependencies)
await build({
  entryPoints: [join(root, 'src', 'cli.ts')],
  outfile: join(root, 'dist', 'parley.mjs'),
  platform: 'node',
  target: `node${floor[1]}`,
  external: dependencies.filter((name) => name !== 'drizzle-orm'),
  ...common
})

const web = join(root, 'web')
mkdirSync(join(web, 'dist'), { recursive: true })
await build({
  entryPoints: [join(web, 'src', 'main.ts')],
  outfile: join(web, 'dist', 'console.js'),
  target: 'es2022',
  minify: true,
  ...common
})
for (const file of ['index.html', 'console.css', 'favicon.svg']) copyFileSync(join(web, file), join(web, 'dist', file))
