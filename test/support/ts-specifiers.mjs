// Lets Node run the TypeScript sources as they are, types stripped (tap's `type-strip-only`, .taprc):
// the sources import each other as `./x.js` (what tsc and esbuild expect under NodeNext), so a
// relative or file: `.js` specifier from outside node_modules that names no such file but has a
// `.ts` twin resolves to the twin (its query kept). Loaded with `--import` (.taprc node-arg) into
// every test process. The code needs no other help: tsconfig's `erasableSyntaxOnly` keeps it to
// syntax that stripping can run.
//
// It also answers one question Node asks slowly: the format of a dependency's `.js` file, which
// Node reads from the nearest package.json each time, parsing its whole `exports` map (drizzle-orm's
// is 178 KB, consulted for each of its hundreds of files): about a third of the CPU a test process
// spent importing the app. A relative `.js`/`.mjs`/`.cjs` import between a dependency's files is
// resolved here, its package's "type" read once per folder.
import module from 'node:module'
import { existsSync, readFileSync, statSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

function twin (specifier, parentURL) {
  if (parentURL === undefined || !parentURL.startsWith('file:') || parentURL.includes('/node_modules/')) return specifier
  if (!/^(\.\.?\/|file:)/.test(specifier)) return specifier
  const url = new URL(specifier, parentURL)
  if (!url.pathname.endsWith('.js') || existsSync(fileURLToPath(url))) return specifier
  url.pathname = url.pathname.slice(0, -3) + '.ts'
  return existsSync(fileURLToPath(url)) ? url.href : specifier
}

const packageTypes = new Map()

/** "module" or "commonjs": the "type" of the package.json nearest to `dir`, as Node looks it up. */
function packageType (dir) {
  let type = packageTypes.get(dir)
  if (type !== undefined) return type
  const manifest = join(dir, 'package.json')
  if (existsSync(manifest)) {
    type = JSON.parse(readFileSync(manifest, 'utf8')).type === 'module' ? 'module' : 'commonjs'
  } else {
    const parent = dirname(dir)
    type = parent === dir || dir.endsWith('/node_modules') ? 'commonjs' : packageType(parent)
  }
  packageTypes.set(dir, type)
  return type
}

const FORMATS = { '.mjs': 'module', '.cjs': 'commonjs' }

/** A dependency's relative import, resolved with its format; undefined for Node to resolve. */
function withinDependency (specifier, context) {
  const parentURL = context.parentURL
  if (parentURL === undefined || !parentURL.startsWith('file:') || !parentURL.includes('/node_modules/')) return undefined
  if (!specifier.startsWith('./') && !specifier.startsWith('../')) return undefined
  if (!context.conditions?.includes('import')) return undefined
  const extension = /\.[mc]?js$/.exec(specifier)?.[0]
  if (extension === undefined) return undefined
  const url = new URL(specifier, parentURL)
  if (url.search !== '' || url.hash !== '') return undefined
  const path = fileURLToPath(url)
  if (!statSync(path, { throwIfNoEntry: false })?.isFile()) return undefined
  return { url: pathToFileURL(path).href, format: FORMATS[extension] ?? packageType(dirname(path)), shortCircuit: true }
}

/** The asynchronous hook, for Node releases before module.registerHooks (22.13, 22.14). */
export async function resolve (specifier, context, nextResolve) {
  return nextResolve(twin(specifier, context.parentURL), context)
}

if (!import.meta.url.endsWith('?hooks')) {
  if (typeof module.registerHooks === 'function') {
    module.registerHooks({
      resolve: (specifier, context, nextResolve) => withinDependency(specifier, context) ?? nextResolve(twin(specifier, context.parentURL), context)
    })
  } else {
    module.register(`${import.meta.url}?hooks`)
  }
}
