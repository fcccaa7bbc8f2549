import type { IncomingMessage } from 'node:http'

/** How a response a test holds paused ends, once it is read: whole ('end'), or cut ('aborted', 'error'). */
export function howItEnds (res: IncomingMessage): Promise<'aborted' | 'error' | 'end'> {
  return new Promise((resolve) => {
    res.on('aborted', () => { resolve('aborted') })
    res.on('error', () => { resolve('error') })
    res.on('end', () => { resolve('end') })
  })
}
