/**
 * Look-ups by id gathered into statements: every id asked for in one turn of the event loop
 * goes to the database together, `perStatement` ids a statement, and an id whose statement went
 * out less than SHARE_MS ago is not asked for again; each caller gets what the statement found
 * for its id (undefined: no such row). Thousands of connected clients re-authenticate as their
 * keys' cache entries run out, each on its own request, and a fan-out's answers bring their next
 * long-polls back in the same few turns: one statement each was a round trip, a plan and a
 * backend's turn per request. A failed statement fails every look-up it carried.
 */
export function createGatheredLookups<V> (findMany: (ids: string[]) => Promise<Map<string, V>>, perStatement: number, now: () => number = () => performance.now()) {
  interface Waiting { resolve: (value: V | undefined) => void, reject: (err: unknown) => void }
  // Ids for the next statement, each with everyone waiting on it (several after a reset in the same turn).
  let next = new Map<string, Waiting[]>()
  // Each id from when it is asked for until its statement answers: askers within SHARE_MS share it.
  const asked = new Map<string, { answer: Promise<V | undefined>, at: number }>()

  function flush (): void {
    const taken = next
    next = new Map()
    const ids = [...taken.keys()]
    for (let i = 0; i < ids.length; i += perStatement) {
      const part = ids.slice(i, i + perStatement)
      Promise.resolve().then(() => findMany(part)).then(
        (found) => { for (const id of part) for (const w of taken.get(id)!) w.resolve(found.get(id)) },
        (err: unknown) => { for (const id of part) for (const w of taken.get(id)!) w.reject(err) })
    }
  }

  return {
    find (id: string): Promise<V | undefined> {
      const already = asked.get(id)
      // A statement that has not answered within SHARE_MS (a connection gone half-open) is left
      // to those already waiting on it: later askers get a statement of their own.
      if (already !== undefined && now() - already.at < SHARE_MS) return already.answer
      const answer = new Promise<V | undefined>((resolve, reject) => {
        if (next.size === 0) setImmediate(flush)
        const waiting = next.get(id)
        if (waiting === undefined) next.set(id, [{ resolve, reject }])
        else waiting.push({ resolve, reject })
      })
      const entry = { answer, at: now() }
      asked.set(id, entry)
      const forget = () => { if (asked.get(id) === entry) asked.delete(id) }
      answer.then(forget, forget)
      return answer
    },
    /** Look-ups asked for from now on get statements of their own (after a change the caller made itself). */
    reset (): void {
      asked.clear()
    }
  }
}

/** How long a statement on its way is shared with new askers of its ids. */
const SHARE_MS = 1_000
