/**
 * A clock that keeps time with the real one and can be moved forward: for code that takes a
 * `now` (buildApp's, the authenticator's), so a test moves past an expiry or a cache's lifetime
 * instead of sleeping through it.
 */
export function movableClock () {
  let ahead = 0
  return {
    now: () => Date.now() + ahead,
    advance (ms: number): void {
      ahead += ms
    }
  }
}
