import AjvCompiler, { type BuildCompilerFromPool, type ErrorObject } from '@fastify/ajv-compiler'

type Validate = ReturnType<ReturnType<BuildCompilerFromPool>>

/** Deeper JSON than any route needs; JSON.stringify and PostgreSQL's jsonb run out of stack well past it. */
const MAX_DEPTH = 32

/**
 * Where `data` holds a value no schema should let through, and what is wrong with it: a number
 * that is not finite, a string with a NUL character (PostgreSQL text cannot hold one), or
 * nesting deeper than MAX_DEPTH.
 */
function unstorable (data: unknown): { path: string, message: string } | undefined {
  // Iterative: a body may nest thousands of levels deep.
  const pending: [unknown, string, number][] = [[data, '', 0]]
  for (let next = pending.pop(); next !== undefined; next = pending.pop()) {
    const [value, path, depth] = next
    if (typeof value === 'number' && !Number.isFinite(value)) return { path, message: 'must be a finite number' }
    if (typeof value === 'string' && value.includes('\u0000')) return { path, message: 'must not contain NUL characters' }
    // Uploaded bytes are not walked: a 10 KiB file is 10,240 entries.
    if (value !== null && typeof value === 'object' && !ArrayBuffer.isView(value)) {
      if (depth > MAX_DEPTH) return { path, message: `must not nest deeper than ${MAX_DEPTH} levels` }
      for (const [key, item] of Object.entries(value)) pending.push([key, `${path}/${key}`, depth + 1], [item, `${path}/${key}`, depth + 1])
    }
  }
  return undefined
}

/**
 * Fastify's Ajv validators, with three holes closed. Ajv coerces a query or form string such as
 * "1e400" or a 400-digit number to Infinity, and then skips `minimum`/`maximum`, which it only
 * checks on finite numbers, so the value reached handlers (and SQL) as Infinity. A NUL in any
 * string reached PostgreSQL, which refuses it with an error (a 500). And JSON nested thousands
 * deep made JSON.stringify overflow its stack (a 500). After a successful validation, each
 * fails it like any other bad value.
 */
export const buildValidator: BuildCompilerFromPool = (externalSchemas, options) => {
  const compile = AjvCompiler()(externalSchemas, options)
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
