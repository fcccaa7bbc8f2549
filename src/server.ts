import type { Writable } from 'node:stream'
import type { FastifyInstance } from 'fastify'
import { buildApp } from './app.js'
import type { Config } from './config.js'
import { openDatabase, type Database } from './db/client.js'
import { migrateDatabase } from './db/migrate.js'
import { demoBanner, seedDemoKey } from './modules/keys/demo.js'
import { createUsersRepository } from './modules/users/users.repository.js'

export interface RunningService {
  app: FastifyInstance
  database: Database
  url: string
  close(): Promise<void>
}

export interface StartOptions {
  logStream?: Writable
  /** Where the one-time demo banner goes (stdout). */
  print?: (text: string) => void
}

/** The address to show people: a wildcard bind is reached through loopback. */
function publicBase (host: string, port: number): string {
  const shown = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host
  return `http://${shown.includes(':') ? `[${shown}]` : shown}:${port}`
}

/**
 * Opens the database, applies pending migrations (under the same advisory lock as
 * `parley migrate`), makes sure the bot user exists, and listens.
 */
export async function startService (config: Config, options: StartOptions = {}): Promise<RunningService> {
  const database = await openDatabase({ databaseUrl: config.databaseUrl, dataDir: config.dataDir, command: 'serve', poolSize: config.databasePoolSize })
  let app: FastifyInstance | undefined
  try {
    const applied = await migrateDatabase(database)
    await createUsersRepository(database.db).ensureBot(config.testBotAddress)
    app = await buildApp({ config, database, logStream: options.logStream })
    app.addHook('onClose', async () => { await database.close() })
    if (applied.length > 0) app.log.info({ migrations: applied }, 'applied migrations')

    await app.listen({ host: config.host, port: config.port })
    const address = app.server.address()
    const port = typeof address === 'object' && address !== null ? address.port : config.port
    const url = publicBase(config.host, port)

    if (database.driver === 'pglite') {
      const demo = await seedDemoKey(database.db)
      if (demo !== undefined) (options.print ?? console.log)(demoBanner(demo, url, config.testBotAddress))
    }
    const running = app
    return { app: running, database, url, close: () => running.close() }
  } catch (err) {
    if (app !== undefined) await app.close()
    else await database.close()
    throw err
  }
}
