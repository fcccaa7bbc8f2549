// Lets Node run the TypeScript sources as they are, types stripped (tap's `type-strip-only`, .taprc):
// the sources import each other as `./x.js` (what tsc and esbuild expect under NodeNext), so a
// relative or file: `.js` specifier from outside node_modules that names no such file but has a
// `.ts` twin resolves to the twin (its query kept). Loaded with `--import` (.taprc node-arg) into
// every test process. The code needs no other help: tsconfig's `erasableSyntaxOnly` keeps it to
// syntax that stripping can run.
import module from 'node:module'
import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

function twin (specifier, parentURL) {
  if (parentURL === undefined || !parentURL.startsWith('file:') || parentURL.includes('/node_modules/')) return specifier
  if (!/^(\.\.?\/|file:)/.test(specifier)) return specifier
  const url = new URL(specifier, parentURL)
  if (!url.pathname.endsWith('.js') || existsSync(fileURLToPath(url))) return specifier
  url.pathname = url.pathname.slice(0, -3) + '.ts'
  return existsSync(fileURLToPath(url)) ? url.href : specifier
}

/** The asynchronous hook, for Node releases before module.registerHooks (22.13, 22.14). */
export async function resolve (specifier, context, nextResolve) {
  return nextResolve(twin(specifier, context.parentURL), context)
}

if (!import.meta.url.endsWith('?hooks')) {
  if (typeof module.registerHooks === 'function') {
    module.registerHooks({ resolve: (specifier, context, nextResolve) => nextResolve(twin(specifier, context.parentURL), context) })
  } else {
    module.register(`${import.meta.url}?hooks`)
  }
}
