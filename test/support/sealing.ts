/** The sealing key the tests' apps and child servers use unless a test gives its own (SEALING_KEYS). */
export const TEST_SEALING_KEYS = `test:${'5e'.repeat(32)}`
