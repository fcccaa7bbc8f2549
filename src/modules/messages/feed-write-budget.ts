/**
 * Each sender's allowance of feed writes, refilled at `perSecond` up to `burst` (a token bucket
 * per sender, in this process): for what fans out to a group's feeds and counts against no
 * quota. A typing indicator toggled at the rate limit (20 requests a second) to a 1,000-member
 * group wrote 13,600 events a second from one key, for ever; its sends stop at the daily quota.
 *
 * A fan-out larger than the burst (a group under a raised MAX_GROUP_MEMBERS) goes when the
 * allowance is full, and leaves it in debt.
 */
export class FeedWriteBudget {
  readonly #perSecond: number
  readonly #burst: number
  readonly #now: () => number
  /** Senders whose allowance is not full: what is left of it and when (ms, on `now`). */
  readonly #left = new Map<string, { feeds: number, at: number }>()
  #sweptAt = 0

  constructor (perSecond: number, burst: number, now: () => number) {
    this.#perSecond = perSecond
    this.#burst = burst
    this.#now = now
  }

  /** Takes `feeds` from `sender`'s allowance: 0 if it could, else the seconds until it could (Retry-After). */
  take (sender: string, feeds: number): number {
    const now = this.#now()
    this.#sweep(now)
    const left = this.#available(sender, now)
    if (feeds > left && left < this.#burst) return Math.max(1, Math.ceil((Math.min(feeds, this.#burst) - left) / this.#perSecond))
    this.#left.set(sender, { feeds: left - feeds, at: now })
    return 0
  }

  #available (sender: string, now: number): number {
    const entry = this.#left.get(sender)
    if (entry === undefined) return this.#burst
    // A clock set back refills nothing, rather than taking the allowance away.
    return Math.min(this.#burst, entry.feeds + Math.max(0, now - entry.at) / 1000 * this.#perSecond)
  }

  /** Once a second at most: forgets the senders whose allowance has filled again, so the map holds only recent ones. */
  #sweep (now: number): void {
    if (Math.abs(now - this.#sweptAt) < 1000) return
    this.#sweptAt = now
    for (const sender of this.#left.keys()) if (this.#available(sender, now) >= this.#burst) this.#left.delete(sender)
  }
}
