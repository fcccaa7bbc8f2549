import { defineConfig } from 'drizzle-kit'

// `drizzle-kit generate` diffs the schema against migrations/meta; it needs no database.
export default defineConfig({
  dialect: 'postgresql',
  schema: './src/db/schema.ts',
  out: './migrations'
})
