import AjvCompiler, { type BuildCompilerFromPool, type ErrorObject } from '@fastify/ajv-compiler'

type Validate = ReturnType<ReturnType<BuildCompilerFromPool>>

/** Deeper JSON than any route needs; JSON.stringify and PostgreSQL's jsonb run out of stack well past it. */
const MAX_DEPTH = 32

// A high surrogate not followed by a low one, or a low one not preceded by a high one (code units).
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/

interface Container { value: object, parent: Container | undefined, key: string, depth: number }

/** What is wrong with a scalar, if anything: PostgreSQL cannot store it, or JSON cannot say it. */
function badScalar (value: unknown): string | undefined {
  if (typeof value === 'number') return Number.isFinite(value) ? undefined : 'must be a finite number'
  if (typeof value !== 'string') return undefined
  if (value.includes('\u0000')) return 'must not contain NUL characters'
  // A lone UTF-16 surrogate ("\ud800") is not text: PostgreSQL refuses it in jsonb, and in text it became U+FFFD.
  if (LONE_SURROGATE.test(value)) return 'must not contain lone UTF-16 surrogates (invalid Unicode)'
  return undefined
}

function pathOf (container: Container | undefined, key?: string): string {
  const keys: string[] = key === undefined ? [] : [key]
  for (let c = container; c !== undefined && c.parent !== undefined; c = c.parent) keys.push(c.key)
  return keys.reverse().map((k) => `/${k}`).join('')
}

/**
 * Where `data` holds a value no schema should let through, and what is wrong with it: a number
 * that is not finite, a string with a NUL character or a lone surrogate, or nesting deeper than
 * MAX_DEPTH. Linear and allocation-free per scalar: a scalar is checked where it is found, only
 * objects and arrays are queued, and a path is built only for the one value at fault (a 1 MiB
 * body of 500,000 numbers costs a few milliseconds, not the 600 ms a path string per element did).
 */
function unstorable (data: unknown): { path: string, message: string } | undefined {
  const top = badScalar(data)
  if (top !== undefined) return { path: '', message: top }
  if (data === null || typeof data !== 'object' || ArrayBuffer.isView(data)) return undefined
  // Iterative: a body may nest thousands of levels deep.
  const pending: Container[] = [{ value: data, parent: undefined, key: '', depth: 0 }]
  for (let c = pending.pop(); c !== undefined; c = pending.pop()) {
    if (c.depth > MAX_DEPTH) return { path: pathOf(c), message: `must not nest deeper than ${MAX_DEPTH} levels` }
    if (Array.isArray(c.value)) {
      const items = c.value as unknown[]
      for (let i = 0; i < items.length; i++) {
        const item = items[i]
        if (item !== null && typeof item === 'object') {
          // Uploaded bytes are not walked: a 10 KiB file is 10,240 entries.
          if (!ArrayBuffer.isView(item)) pending.push({ value: item, parent: c, key: String(i), depth: c.depth + 1 })
          continue
        }
        const bad = badScalar(item)
        if (bad !== undefined) return { path: pathOf(c, String(i)), message: bad }
      }
      continue
    }
    for (const key in c.value) {
      if (!Object.hasOwn(c.value, key)) continue
      const badKey = badScalar(key)
      if (badKey !== undefined) return { path: pathOf(c, key), message: `name ${badKey}` }
      const item = (c.value as Record<string, unknown>)[key]
      if (item !== null && typeof item === 'object') {
        if (!ArrayBuffer.isView(item)) pending.push({ value: item, parent: c, key, depth: c.depth + 1 })
        continue
      }
      const bad = badScalar(item)
      if (bad !== undefined) return { path: pathOf(c, key), message: bad }
    }
  }
  return undefined
}

/**
 * Fastify's Ajv validators, with three holes closed. Ajv coerces a query or form string such as
 * "1e400" or a 400-digit number to Infinity, and then skips `minimum`/`maximum`, which it only
 * checks on finite numbers, so the value reached handlers (and SQL) as Infinity. A NUL in any
 * string reached PostgreSQL, which refuses it with an error (a 500). And JSON nested thousands
 * deep made JSON.stringify overflow its stack (a 500). A lone surrogate reached jsonb (a 500) or
 * text (silently U+FFFD). After a successful validation, each
 * fails it like any other bad value.
 */
// One pool for the process: an app built again with the same shared schemas and options (a
// second instance in one process, each test's app) reuses its Ajv, whose cache already holds the
// validators of the route schemas it compiled before.
const pool = AjvCompiler()

export const buildValidator: BuildCompilerFromPool = (externalSchemas, options) => {
  const compile = pool(externalSchemas, options)
  return (route) => {
    const validate = compile(route)
    function checked (data: unknown): boolean {
      const valid = validate(data)
      if (valid !== true) {
        checked.errors = validate.errors
        return false
      }
      const found = unstorable(data)
      if (found === undefined) return true
      checked.errors = [{ instancePath: found.path, schemaPath: '#', keyword: 'storable', params: {}, message: found.message }]
      return false
    }
    checked.errors = null as ErrorObject[] | null | undefined
    checked.schema = validate.schema
    checked.schemaEnv = validate.schemaEnv
    return checked as Validate
  }
}
