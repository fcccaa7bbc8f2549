import AjvCompiler, { type BuildCompilerFromPool, type ErrorObject } from '@fastify/ajv-compiler'

type Validate = ReturnType<ReturnType<BuildCompilerFromPool>>

/**
 * Where `data` holds a value no schema should let through, and what is wrong with it: a number
 * that is not finite, or a string with a NUL character (PostgreSQL text cannot hold one).
 */
function unstorable (data: unknown): { path: string, message: string } | undefined {
  // Iterative: a body may nest thousands of levels deep.
  const pending: [unknown, string][] = [[data, '']]
  for (let next = pending.pop(); next !== undefined; next = pending.pop()) {
    const [value, path] = next
    if (typeof value === 'number' && !Number.isFinite(value)) return { path, message: 'must be a finite number' }
    if (typeof value === 'string' && value.includes('\u0000')) return { path, message: 'must not contain NUL characters' }
    if (value !== null && typeof value === 'object') {
      for (const [key, item] of Object.entries(value)) pending.push([key, `${path}/${key}`], [item, `${path}/${key}`])
    }
  }
  return undefined
}

/**
 * Fastify's Ajv validators, with two holes closed. Ajv coerces a query or form string such as
 * "1e400" or a 400-digit number to Infinity, and then skips `minimum`/`maximum`, which it only
 * checks on finite numbers, so the value reached handlers (and SQL) as Infinity. And a NUL in
 * any string reached PostgreSQL, which refuses it with an error (a 500). After a successful
 * validation, either fails it like any other bad value.
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
