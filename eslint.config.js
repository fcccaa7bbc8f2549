// ESLint (flat config): neostandard, the standard style with TypeScript support. `npm run lint`.
import neostandard from 'neostandard'

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
  }
]
