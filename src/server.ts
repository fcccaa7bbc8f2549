import { createServer, type Server } from 'node:http'
import type { Writable } from 'node:stream'
import type { FastifyInstance } from 'fastify'
import { buildApp } from './app.js'
import type { Config } from './config.js'
import { openDatabase, type Database } from './db/client.js'
import { loggableError } from './db/errors.js'
import { migrateDatabase } from './db/migrate.js'
import { startStatisticsUpkeep } from './db/statistics.js'
import { settleAnnouncements } from './modules/events/announcements.repository.js'
import { METRICS_CONTENT_TYPE } from './modules/health/health.routes.js'
import { demoBanner, seedDemoKey } from './modules/keys/demo.js'
import { createUsersRepository } from './modules/users/users.repository.js'
import { startSealingPass } from './sealing/background-seal.js'
import { verifySealingKeys } from './sealing/key-check.js'
import { resolveSealingKeys } from './sealing/key-file.js'

export interface RunningService {
  app: FastifyInstance
  database: Database
  url: string
  /** Where GET /metrics answers when METRICS_PORT gives it a listener of its own. */
  metricsUrl: string | undefined
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
 * GET /metrics on a listener of its own (METRICS_PORT), so a firewall or a container port map
 * can keep it internal while the API is public. Closed with the app.
 */
async function listenForMetrics (app: FastifyInstance, host: string, port: number): Promise<string> {
  const server: Server = createServer((req, res) => {
    if (req.method !== 'GET' || req.url?.split('?')[0] !== '/metrics') {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('Not Found: this listener serves GET /metrics only\n')
      return
    }
    app.metrics.render().then((text) => {
      res.writeHead(200, { 'content-type': METRICS_CONTENT_TYPE }).end(text)
    }, (err: unknown) => {
      app.log.error({ err }, 'metrics could not be rendered')
      res.writeHead(500, { 'content-type': 'text/plain' }).end('Internal Server Error\n')
    })
  })
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, host, () => { server.off('error', reject); resolve() })
  })
  app.addHook('onClose', async () => {
    server.closeAllConnections()
    await new Promise((resolve) => server.close(resolve))
  })
  const address = server.address()
  const url = `${publicBase(host, typeof address === 'object' && address !== null ? address.port : port)}/metrics`
  app.log.info(`Metrics listening at ${url}`)
  return url
}

/**
 * Resolves the sealing keys (refusing on PostgreSQL without SEALING_KEYS, before connecting),
 * opens the database, applies pending migrations (under the same advisory lock as `parley
 * migrate`), checks the keys against the database, makes sure the bot user exists, and
 * listens; then, in the background, seals what was written before sealing and analyzes the
 * tables whose planner statistics are missing or behind (db/statistics.ts).
 */
export async function startService (given: Config, options: StartOptions = {}): Promise<RunningService> {
  const sealing = resolveSealingKeys(given)
  const config: Config = { ...given, sealingKeys: sealing.keys }
  const database = await openDatabase({
    databaseUrl: config.databaseUrl,
    directUrl: config.databaseDirectUrl,
    pooler: config.databasePooler,
    dataDir: config.dataDir,
    command: 'serve',
    poolSize: config.databasePoolSize,
    listenHeartbeatMs: config.listenHeartbeatMs
  })
  let app: FastifyInstance | undefined
  try {
    const applied = await migrateDatabase(database)
    await verifySealingKeys(database.db, sealing)
    await createUsersRepository(database.db).ensureBot(config.testBotAddress)
    app = await buildApp({ config, database, logStream: options.logStream })
    // The last writes' announcements go out first: other instances' waiters hear of them now.
    app.addHook('onClose', async () => {
      await settleAnnouncements(database.db)
      await database.close()
    })
    const log = app.log
    database.onStatementsLost((err) => {
      log.warn({ err: loggableError(err) }, 'a named prepared statement was not found on its connection: DATABASE_URL looks like a ' +
        'transaction pooler; this process uses unnamed statements from now on. Set DATABASE_POOLER=transaction and ' +
        'DATABASE_DIRECT_URL (a connection past the pooler), or LISTEN and migrations go through the pooler too')
    })
    if (applied.length > 0) app.log.info({ migrations: applied }, 'applied migrations')
    if (sealing.generated !== undefined) app.log.warn({ keyFile: sealing.source }, sealing.generated)
    // Started once listening (below); stopped before the database closes (onClose), after its current page.
    let stopSealing = async (): Promise<void> => {}
    let stopStatistics = async (): Promise<void> => {}
    app.addHook('preClose', async () => { await Promise.all([stopSealing(), stopStatistics()]) })
    // Said once at start: `auto` decides by comparing the two URLs as text, and a pooler mode
    // nobody meant costs the send its named statements (BENCHMARKS.md).
    if (database.driver === 'pg') {
      app.log.info({ pooler: config.databasePooler, directUrl: config.databaseDirectUrl !== undefined, readReplica: config.databaseReadUrl !== undefined },
        config.databasePooler === 'transaction'
          ? 'DATABASE_URL is taken for a transaction pooler: unnamed statements there; LISTEN and migrations on DATABASE_DIRECT_URL'
          : 'DATABASE_URL is taken for a direct connection: named statements for the hottest queries')
    }

    // Before listening, so a server that answers has its demo key (the banner needs the port).
    const demo = database.driver === 'pglite' ? await seedDemoKey(database.db) : undefined

    // First: its close hook must be added before the app listens.
    const metricsUrl = config.metricsPort === undefined ? undefined : await listenForMetrics(app, config.host, config.metricsPort)
    await app.listen({ host: config.host, port: config.port })
    const address = app.server.address()
    const port = typeof address === 'object' && address !== null ? address.port : config.port
    const url = publicBase(config.host, port)

    if (demo !== undefined) (options.print ?? console.log)(demoBanner(demo, url, config.testBotAddress))
    stopSealing = startSealingPass(database.db, app.log)
    stopStatistics = startStatisticsUpkeep(database, app.log)
    const running = app
    return { app: running, database, url, metricsUrl, close: () => running.close() }
  } catch (err) {
    if (app !== undefined) await app.close()
    else await database.close()
    throw err
  }
}
