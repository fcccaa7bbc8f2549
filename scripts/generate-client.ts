// Writes src/client/schema.ts from the OpenAPI document the server serves (built here on a
// throwaway in-memory database). Run by `npm run client:generate` after changing a route schema.
import { writeFileSync } from 'node:fs'
import { PGlite } from '@electric-sql/pglite'
import { buildApp } from '../src/app.js'
import { clientTypes, SCHEMA_FILE } from '../src/client/generate.js'
import { loadConfig } from '../src/config.js'
import { wrapPglite } from '../src/db/client.js'
import { migrateDatabase } from '../src/db/migrate.js'

const database = wrapPglite(await PGlite.create())
await migrateDatabase(database)
const app = await buildApp({ config: loadConfig({ LOG_LEVEL: 'silent' }), database })
await app.ready()
writeFileSync(SCHEMA_FILE, await clientTypes(app.swagger()))
await app.close()
await database.close()
console.log(`wrote ${SCHEMA_FILE}`)
