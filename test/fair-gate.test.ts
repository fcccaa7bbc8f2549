import t from 'tap'
import { FairGate } from '../src/fair-gate.js'

t.test('a key with a backlog delays another key by one turn, not by its whole queue', async (t) => {
  const gate = new FairGate({ capacity: 1, perKey: 1, maxQueuedPerKey: 100 })
  const order: string[] = []
  const leaves: (() => void)[] = []
  const run = (key: string, n: number) => gate.enter(key).then((leave) => { order.push(`${key}${n}`); leaves.push(leave) })
  const all = [...Array.from({ length: 10 }, (_, i) => run('a', i)), run('b', 0)]
  await new Promise((resolve) => setImmediate(resolve))
  t.same(order, ['a0'], 'one place: the first holds it')
  for (let i = 0; i < 10; i++) {
    leaves.shift()!()
    await new Promise((resolve) => setImmediate(resolve))
  }
  await Promise.all(all)
  t.ok(order.indexOf('b0') <= 2, `b waited one turn of a's, not ten: ${order.join(' ')}`)
  t.same(gate.stats(), { held: 1, waiting: 0 })
})

t.test('per-key and total limits both hold; a full queue refuses at once; a waiter that goes away leaves its place', async (t) => {
  const gate = new FairGate({ capacity: 3, perKey: 2, maxQueuedPerKey: 1 })
  const tick = () => new Promise((resolve) => setImmediate(resolve))
  const admitted: string[] = []
  const enter = (key: string) => gate.enter(key).then((leave) => { admitted.push(key); return leave })
  const a1 = await enter('a')
  await enter('a')
  const b1 = await enter('b')
  const a3 = enter('a')
  await t.rejects(gate.enter('a'), { name: 'QueueFull' }, 'a second waiter of one key is refused at once')
  const c1 = enter('c')
  let cancel = () => {}
  const d1 = gate.enter('d', (c) => { cancel = c })
  t.same(gate.stats(), { held: 3, waiting: 3 })
  cancel()
  await t.rejects(d1, { name: 'Abandoned' })
  t.same(gate.stats(), { held: 3, waiting: 2 }, 'the abandoned waiter left the queue')
  a1()
  await tick()
  t.same(admitted, ['a', 'a', 'b', 'a'], 'a freed place of a goes to its waiter: c would exceed the total')
  b1()
  await tick()
  t.same(admitted, ['a', 'a', 'b', 'a', 'c'])
  const leaves = await Promise.all([a3, c1])
  leaves[0]()
  leaves[0]()
  t.equal(gate.stats().held, 2, 'leaving twice gives back one place')
})
