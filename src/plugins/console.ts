import { existsSync } from 'node:fs'
import { join } from 'node:path'
import helmet from '@fastify/helmet'
import fastifyStatic from '@fastify/static'
import type { FastifyInstance } from 'fastify'
import { ROOT } from '../paths.js'

/** Where `npm ci`, `npm start` and `npm test` build the console (scripts/build.mjs). */
const CONSOLE_DIR = join(ROOT, 'web', 'dist')

/**
 * The web console at GET /: static files only (it talks to /v2 like any client), served with
 * a strict Content-Security-Policy — scripts and styles from this origin only, no inline script,
 * no eval; images also from blob: (attachments are fetched with the key, then shown).
 */
export async function consolePlugin (app: FastifyInstance): Promise<void> {
  if (!existsSync(join(CONSOLE_DIR, 'index.html'))) {
    app.log.warn('the web console is not built (run npm run build); GET / answers 404')
    return
  }
  await app.register(helmet, {
    contentSecurityPolicy: {
      useDefaults: false,
      directives: {
        defaultSrc: ["'self'"],
        scriptSrc: ["'self'"],
        styleSrc: ["'self'"],
        imgSrc: ["'self'", 'blob:'],
        connectSrc: ["'self'"],
        fontSrc: ["'self'"],
        objectSrc: ["'none'"],
        baseUri: ["'none'"],
        formAction: ["'self'"],
        frameAncestors: ["'none'"]
      }
    },
    // Same-origin API calls only; no need to isolate further.
    crossOriginEmbedderPolicy: false
  })
  await app.register(fastifyStatic, {
    root: CONSOLE_DIR,
    prefix: '/',
    // One route per built file, found at start-up: no catch-all to shadow unknown-path 404s.
    wildcard: false,
    index: ['index.html'],
    cacheControl: true,
    maxAge: 0
  })
}
