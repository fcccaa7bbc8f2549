import t from 'tap'
import { gcra } from '../../src/plugins/rate-limit-stores.js'

/** Runs requests at the given times (ms) through one bucket of `max` per second; which were allowed. */
function run (times: number[], max: number): boolean[] {
  let tat: number | undefined
  return times.map((now) => {
    const result = gcra(tat, now, 1000, max)
    tat = result.tat
    return result.current <= max
  })
}

t.test('GCRA: a client under the rate is not refused for arriving bunched', async (t) => {
  // One request, then 20 at once 900 ms later: 21 within one second, but 20 per second on
  // average. A fixed window opened by the first request refused the 21st.
  t.same(run([0, ...Array(20).fill(900)], 20), Array(21).fill(true))
  // 15 per second whose answers came back late, so they arrive in fives every third of a second.
  const bunched = Array.from({ length: 45 }, (_, i) => Math.floor(i / 5) * 333)
  t.same(run(bunched, 20).filter((ok) => !ok).length, 0, '45 requests at 15/s in bunches of 5: none refused')
})

t.test('GCRA: a burst past the limit is refused, and the bucket refills one place per period/max', async (t) => {
  t.same(run(Array(21).fill(0), 20), [...Array(20).fill(true), false])
  const refused = gcra(20 * 50, 0, 1000, 20)
  t.same(refused, { tat: 1000, current: 21, ttl: 50 }, 'refused: retry when one place frees, 50 ms on')
  t.same(run([...Array(20).fill(0), 50], 20).at(-1), true, 'one place back after 50 ms')
  t.same(gcra(undefined, 0, 1000, 4), { tat: 250, current: 1, ttl: 250 })
})
