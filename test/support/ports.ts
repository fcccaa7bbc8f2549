import { createServer } from 'node:net'

/** A loopback TCP port free a moment ago, for a server a test starts (PostgreSQL, PgBouncer, Caddy). */
export async function freePort (): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const address = server.address()
      server.close(() => typeof address === 'object' && address !== null ? resolve(address.port) : reject(new Error('no port')))
    })
  })
}
