import type { Credentials } from './api.js'

// sessionStorage: the secret lives only as long as this tab, never in a URL or localStorage.
const KEY = 'parley.credentials'

export function loadCredentials (): Credentials | undefined {
  try {
    const stored = JSON.parse(sessionStorage.getItem(KEY) ?? 'null') as Partial<Credentials> | null
    return typeof stored?.keyId === 'string' && typeof stored.secret === 'string' ? { keyId: stored.keyId, secret: stored.secret } : undefined
  } catch {
    return undefined
  }
}

export function saveCredentials (credentials: Credentials): void {
  sessionStorage.setItem(KEY, JSON.stringify(credentials))
}

export function clearCredentials (): void {
  sessionStorage.removeItem(KEY)
}
