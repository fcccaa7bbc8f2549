/**
 * Failed authentications per client network in one-second windows. Past the limit, a request
 * from that network whose key id is not already known to the process (cached) is refused
 * before any database lookup: a flood of made-up key ids costs the database nothing after its
 * first second, while a working key behind the same address keeps working.
 */
export class AuthFailures {
  private readonly windows = new Map<string, { count: number, startedAt: number }>()

  private readonly perSecond: number
  private readonly now: () => number

  constructor (perSecond: number, now: () => number = Date.now) {
    this.perSecond = perSecond
    this.now = now
  }

  record (network: string): void {
    const at = this.now()
    let window = this.windows.get(network)
    if (window === undefined || window.startedAt + 1000 <= at) {
      if (this.windows.size >= 100_000) this.sweep(at)
      window = { count: 0, startedAt: at }
      this.windows.set(network, window)
    }
    window.count++
  }

  /** Whether this network has failed more than its limit in the current second. */
  exceeded (network: string): boolean {
    const window = this.windows.get(network)
    return window !== undefined && window.startedAt + 1000 > this.now() && window.count >= this.perSecond
  }

  private sweep (at: number): void {
    for (const [network, window] of this.windows) if (window.startedAt + 1000 <= at) this.windows.delete(network)
  }
}
