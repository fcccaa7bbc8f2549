import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { withoutTapLoader } from './processes.js'

export { p99 } from './bystander.js'

/**
 * Runs an abuser's client: `script` (CommonJS, its arguments from process.argv[1] on) in a child
 * process at the lowest CPU priority, and resolves with the JSON it prints. An attacker's client
 * runs on its own machine; on this 2-core one, in the server's process or at full priority, it
 * would take CPU from the server it attacks, and the test would measure the harness (CI measured
 * 306 ms that way where the service alone gave 30-86 ms).
 */
export async function fromAbuser<T> (script: string, args: string[]): Promise<T> {
  const child = spawn('nice', ['-n', '19', process.execPath, '-e', script, ...args], { env: withoutTapLoader(process.env), stdio: ['ignore', 'pipe', 'inherit'] })
  let out = ''
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => { out += chunk })
  const [code] = await once(child, 'close') as [number | null]
  if (code !== 0) throw new Error(`the abuser's client exited with ${code}`)
  return JSON.parse(out) as T
}
