/**
 * The places each API key holds in waits on its feed, long-polls and event streams together
 * (MAX_LONG_POLLS_PER_KEY in this process): each holds a socket and a timer, so one key must not
 * hoard them. `take` gives a place and the way to give it back (once, however often called), or
 * undefined when the key holds all of its places.
 */
export function createWaitingPlaces (maxPerKey: number) {
  const held = new Map<string, number>()
  return {
    take (keyId: string): (() => void) | undefined {
      const now = held.get(keyId) ?? 0
      if (now >= maxPerKey) return undefined
      held.set(keyId, now + 1)
      let given = false
      return () => {
        if (given) return
        given = true
        const left = (held.get(keyId) ?? 1) - 1
        if (left <= 0) held.delete(keyId)
        else held.set(keyId, left)
      }
    }
  }
}

export type WaitingPlaces = ReturnType<typeof createWaitingPlaces>
