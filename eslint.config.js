// ESLint (flat config): neostandard, the standard style with TypeScript support. `npm run lint`.
import neostandard from 'neostandard'

// A module uses another only through its repository, service, schemas or table (types aside).
const acrossModules = {
  group: ['../*/*', '!../../**', '!../*/*.repository.js', '!../*/*.service.js', '!../*/*.schemas.js', '!../*/*.table.js'],
  allowTypeImports: true,
  message: 'Use another module through its repository, service, schemas or table.'
}

export default [
  ...neostandard({
    ts: true,
    ignores: [
      // Build output, runtime data and tool caches.
      'dist/**',
      'web/dist/**',
      'data/**',
      'coverage/**',
      '.tap/**',
      'scratch/**',
      // Written by `npm run client:generate` (openapi-typescript); test/openapi.test.ts checks it
      // is exactly what the served document generates, so it is never edited by hand.
      'src/client/schema.ts'
    ]
  }),
  {
    rules: {
      // `void promise` as a statement is how this code marks a promise it deliberately does not
      // await (a wake-up, a background read that handles its own errors); `void` inside an
      // expression still reports.
      'no-void': ['error', { allowAsStatement: true }],
      // Its loops wait on a flag another callback clears (`while (running) await ...`, stopped by
      // close() or a timer); the rule only sees writes inside the loop, so every report here was
      // a false positive.
      'no-unmodified-loop-condition': 'off'
    }
  },
  {
    // One way to run a transaction: db/transaction.ts's, which runs it again when the database
    // asks (a deadlock, a serialization failure, a named statement lost through a pooler)
    // instead of answering 500. Where a retry would be wrong, the call says why and is let
    // through (eslint-disable-next-line: replica.ts, and the send writer's `attempt`).
    files: ['src/**/*.ts'],
    ignores: ['src/db/transaction.ts'],
    rules: {
      'no-restricted-syntax': ['error', {
        selector: "CallExpression[callee.type='MemberExpression'][callee.property.name='transaction']",
        message: 'Run transactions with transaction(db, work) from src/db/transaction.ts: it retries what the database asks to have run again.'
      }]
    }
  },
  // The layering (README, Layout), checked rather than hoped for.
  {
    files: ['src/modules/**/*.ts'],
    rules: { '@typescript-eslint/no-restricted-imports': ['error', { patterns: [acrossModules] }] }
  },
  {
    // Every statement has an owner: only repositories, tables and the search query builder
    // speak SQL; routes, services and the rest go through them.
    files: ['src/modules/**/*.ts'],
    ignores: ['src/modules/**/*.repository.ts', 'src/modules/**/*.table.ts', 'src/modules/search/message-search.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': ['error', {
        patterns: [acrossModules, { group: ['drizzle-orm', 'drizzle-orm/*'], message: 'Statements belong in a repository (*.repository.ts).' }]
      }]
    }
  },
  {
    // Below the modules sit the plugins, the database layer and the shared files of src/: they
    // never depend on a module, not even for a type, so nothing reaches a module through them
    // either. Only the composition roots (app.ts, server.ts, cli.ts) and the schema index that
    // drizzle-kit reads (db/schema.ts) import modules; auth.ts names the principal (below).
    files: ['src/*.ts', 'src/plugins/**/*.ts', 'src/db/**/*.ts', 'src/client/**/*.ts'],
    ignores: ['src/app.ts', 'src/server.ts', 'src/cli.ts', 'src/db/schema.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': ['error', {
        patterns: [{ group: ['**/modules/**', './modules/**'], message: 'Plugins, src/db and the shared files of src/ must not depend on a module.' }]
      }]
    }
  },
  {
    // The one module type a plugin names: the principal auth.ts verifies and every route reads.
    files: ['src/plugins/auth.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': ['error', {
        patterns: [{
          group: ['**/modules/**'],
          allowImportNames: ['Principal'],
          message: 'A plugin names no module but the principal (keys/authenticator.js, as a type).'
        }]
      }]
    }
  }
]
