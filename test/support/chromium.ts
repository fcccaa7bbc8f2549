import { existsSync } from 'node:fs'

/** Debian's Chromium (apt-get install chromium), or CHROMIUM_PATH; never a downloaded browser. */
export function chromiumPath (): string | undefined {
  const candidates = [process.env.CHROMIUM_PATH, '/usr/bin/chromium', '/usr/bin/chromium-browser'].filter((p): p is string => p !== undefined && p !== '')
  return candidates.find((path) => existsSync(path))
}

/** The flags the browser tests start Chromium with. */
export const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking']
