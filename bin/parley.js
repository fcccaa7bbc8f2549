#!/usr/bin/env node
// The `parley` command. The service runs from its TypeScript sources through tsx's loader,
// in this same process (no child), so signals and the embedded-database lock see one pid.
import { register } from 'tsx/esm/api'

register()
const { main } = await import('../src/cli.ts')
process.exitCode = await main(process.argv.slice(2))
