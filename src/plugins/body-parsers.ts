import formbody from '@fastify/formbody'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { parse as parseQuery } from 'fast-querystring'
import { UnsupportedMediaType, ValidationFailed } from '../errors.js'
import { formFieldsOver, jsonValuesOver } from './body-budget.js'

declare module 'fastify' {
  interface FastifyContextConfig {
    /**
     * The route takes file uploads, so it accepts multipart/form-data (parsed by the messages
     * module's uploads plugin, messages/uploads.plugin.ts, next to the attachment store).
     */
    acceptsFiles?: boolean
  }
}

/** JSON and form bodies are capped at 1 MiB before they are buffered (API.md §1). */
export const BODY_LIMIT = 1024 * 1024

export interface BodyParserOptions {
  /** The most values a JSON body (or fields a form body) may hold: see body-budget.ts. */
  maxBodyValues: number
}

/**
 * Three body formats, one shape: JSON, form and multipart all arrive as a flat object of
 * fields, so one TypeBox schema validates them all. Repeated form fields arrive as arrays, and
 * Ajv's `coerceTypes: 'array'` (Fastify's default) turns a single value into a one-element
 * list and numeric strings into numbers where the schema asks for them. JSON and form bodies
 * here; multipart, which only routes that take files accept and which makes their files, in
 * messages/uploads.plugin.ts.
 */
export const bodyParsersPlugin = fp(async (app: FastifyInstance, opts: BodyParserOptions) => {
  // Only the three formats of the contract: text/plain (a Fastify default) is refused with 415.
  app.removeContentTypeParser('text/plain')
  const tooMany = () => new ValidationFailed(`body: more than ${opts.maxBodyValues} values; no request needs that many`)
  await app.register(formbody, {
    bodyLimit: BODY_LIMIT,
    parser: (text: string) => {
      if (formFieldsOver(text, opts.maxBodyValues)) throw tooMany()
      return parseQuery(text)
    }
  })
  // Fastify's own JSON parser (prototype-poisoning checks included), after the count.
  const parseJson = app.getDefaultJsonParser('error', 'error')
  app.removeContentTypeParser('application/json')
  app.addContentTypeParser('application/json', { parseAs: 'string', bodyLimit: BODY_LIMIT }, (req, body, done) => {
    if (jsonValuesOver(body as string, opts.maxBodyValues)) return done(tooMany(), undefined)
    parseJson(req, body as string, done)
  })

  // A route that takes no files answers multipart with 415 before anything is read.
  app.addHook('preParsing', async (req) => {
    if (req.routeOptions.config.acceptsFiles === true) return
    // The parser has not run yet in preParsing, so look at the header itself.
    if (/^\s*multipart\//i.test(req.headers['content-type'] ?? '')) {
      throw new UnsupportedMediaType(
        `multipart/form-data is accepted only by routes that take files; send ${req.method} ${req.routeOptions.url ?? req.url} as application/json or application/x-www-form-urlencoded`
      )
    }
  })
}, { name: 'parley-body-parsers' })
