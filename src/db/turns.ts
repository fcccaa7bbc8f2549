import { setImmediate } from 'node:timers/promises'

/**
 * A turn of the event loop, for code that runs statement after statement (a file streamed a
 * chunk at a time, an export's pages). The embedded database runs a statement on this thread
 * and resolves it at once, and a client that keeps up always has room: without a turn such a
 * chain never leaves its microtasks, and no other request is even read until it ends. A 1 GiB
 * export held every other request for 45 s so; an upload of 10 x 8 MiB, ~100 ms. On PostgreSQL
 * a turn is already there (the socket) and this one costs microseconds.
 */
export async function giveTheLoopATurn (): Promise<void> {
  await setImmediate()
}
