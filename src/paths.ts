import { existsSync } from 'node:fs'
import { dirname, join } from 'node:path'

/**
 * The package's root directory: the nearest one up from this module holding package.json. The
 * same from the TypeScript sources (src/) and from the bundle (dist/).
 */
function packageRoot (from: string): string {
  for (let dir = from; ; dir = dirname(dir)) {
    if (existsSync(join(dir, 'package.json'))) return dir
    if (dirname(dir) === dir) throw new Error(`no package.json above ${from}`)
  }
}

export const ROOT = packageRoot(import.meta.dirname)
