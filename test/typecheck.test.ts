import { execFile } from 'node:child_process'
import { join } from 'node:path'
import { promisify } from 'node:util'
import t from 'tap'
import { usingPostgres } from './support/databases.js'

const ROOT = join(import.meta.dirname, '..')
const TSC = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc')

// tap runs the tests through a transpiler and the build bundles without checking types, so
// without this nothing in CI would notice a type error: in the console above all, whose types
// come from the generated client (src/client/schema.ts). Once per CI run, in the PGlite pass.
for (const project of ['.', 'web']) {
  t.test(`tsc -p ${project} finds no type error`, { skip: usingPostgres() ? 'runs once per CI run, in the PGlite pass' : false, timeout: 180_000 }, async (t) => {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, [TSC, '-p', project, '--noEmit'], { cwd: ROOT }).catch((err: { stdout: string, stderr: string }) => err)
    t.equal(`${stdout}${stderr}`.trim(), '', 'no diagnostics')
  })
}
