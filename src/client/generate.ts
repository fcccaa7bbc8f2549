import openapiTS, { astToString } from 'openapi-typescript'
import ts from 'typescript'

/** Where the generated types live; `npm run client:generate` writes it, a test checks it is current. */
export const SCHEMA_FILE = 'src/client/schema.ts'

const HEADER = `// Generated from GET /v2/openapi.json by \`npm run client:generate\` (openapi-typescript).
// Do not edit: change the route schemas (or src/plugins/openapi.ts) and regenerate; test/openapi.test.ts
// fails while this file and the served document disagree.
`

/** TypeScript types for every path, operation and component of the OpenAPI document. */
export async function clientTypes (document: unknown): Promise<string> {
  const ast = await openapiTS(document as Parameters<typeof openapiTS>[0], {
    alphabetize: true,
    exportType: true,
    // Files (uploads and the attachment download) are bytes: Blob, as fetch and FormData take them.
    transform: (schema) => schema.format === 'binary' ? ts.factory.createTypeReferenceNode('Blob') : undefined
  })
  return `${HEADER}${astToString(ast)}`
}
