/**
 * Look-ups by id gathered into statements: every id asked for in one turn of the event loop
 * goes to the database together, `perStatement` ids a statement, and an id already on its way
 * is not asked for again; each caller gets what the statement found for its id (undefined: no
 * such row). Thousands of connected clients re-authenticate as their keys' cache entries run
 * out, each on its own request, and a fan-out's answers bring their next long-polls back in the
 * same few turns: one statement each was a round trip, a plan and a backend's turn per request.
 * A failed statement fails every look-up it carried.
 */
export function createGatheredLookups<V> (findMany: (ids: string[]) => Promise<Map<string, V>>, perStatement: number): (id: string) => Promise<V | undefined> {
  interface Waiting { resolve: (value: V | undefined) => void, reject: (err: unknown) => void }
  let next = new Map<string, Waiting>()
  // Every id from when it is asked for until its statement answers: later askers share it.
  const asked = new Map<string, Promise<V | undefined>>()

  function flush (): void {
    const taken = next
    next = new Map()
    const ids = [...taken.keys()]
    for (let i = 0; i < ids.length; i += perStatement) {
      const part = ids.slice(i, i + perStatement)
      findMany(part).then(
        (found) => { for (const id of part) taken.get(id)!.resolve(found.get(id)) },
        (err: unknown) => { for (const id of part) taken.get(id)!.reject(err) })
    }
  }

  return (id) => {
    const already = asked.get(id)
    if (already !== undefined) return already
    const answer = new Promise<V | undefined>((resolve, reject) => {
      if (next.size === 0) setImmediate(flush)
      next.set(id, { resolve, reject })
    })
    asked.set(id, answer)
    const forget = () => { asked.delete(id) }
    answer.then(forget, forget)
    return answer
  }
}
