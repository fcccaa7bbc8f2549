import { execFile } from 'node:child_process'
import { chownSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { connect, createServer, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { promisify } from 'node:util'
import pg from 'pg'
import type { TestContext } from '../helper.js'
import { freePort } from './ports.js'

const run = promisify(execFile)

export interface ReplicatedPostgres {
  primaryUrl: string
  replicaUrl: string
  /** Runs one statement on the replica (pg_wal_replay_pause() and the like). */
  onReplica(text: string): Promise<void>
  /** Runs statements on the primary, one after the other; answers the last one's rows. */
  onPrimary(...texts: string[]): Promise<Record<string, unknown>[]>
  /** Stops the replica's postmaster (by its PID, immediately) / starts it again. */
  stopReplica(): Promise<void>
  startReplica(): Promise<void>
}

/**
 * A primary of the test's own (initdb on a free loopback port, trusting local replication
 * connections, as initdb's pg_hba.conf does) and a streaming replica of it made with
 * pg_basebackup -R, on another port. The machine's shared cluster is left alone (its
 * pg_hba.conf need not allow replication). initdb and postgres refuse root, so as root they
 * run as the postgres user. Both are stopped at teardown and their directory removed.
 */
export async function replicatedPostgres (t: TestContext, bin: string): Promise<ReplicatedPostgres> {
  const dir = mkdtempSync(join(tmpdir(), 'parley-replica-'))
  const asRoot = process.getuid?.() === 0
  if (asRoot) {
    const { stdout: uid } = await run('id', ['-u', 'postgres'])
    const { stdout: gid } = await run('id', ['-g', 'postgres'])
    chownSync(dir, Number(uid.trim()), Number(gid.trim()))
  }
  const tool = (name: string, args: string[]) => asRoot
    ? run('runuser', ['-u', 'postgres', '--', join(bin, name), ...args])
    : run(join(bin, name), args)
  const [primaryPort, replicaPort] = [await freePort(), await freePort()]
  const primaryData = join(dir, 'primary')
  const replicaData = join(dir, 'replica')
  // pg_stat_statements: the test counts the statements the service sends the primary.
  const options = (port: number) => `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c shared_preload_libraries=pg_stat_statements`
  const start = (data: string, port: number, log: string) => tool('pg_ctl', ['-D', data, '-o', options(port), '-l', join(dir, log), '-w', 'start'])
  /** By the postmaster's PID (postmaster.pid): SIGQUIT is an immediate shutdown; waits until it is gone. */
  const stop = async (data: string) => {
    const file = join(data, 'postmaster.pid')
    if (!existsSync(file)) return
    const pid = Number(readFileSync(file, 'utf8').split('\n')[0])
    if (!Number.isInteger(pid) || pid <= 0) return
    try {
      process.kill(pid, 'SIGQUIT')
    } catch {
      return
    }
    for (let i = 0; i < 200; i++) {
      try {
        process.kill(pid, 0)
      } catch {
        return
      }
      await sleep(25)
    }
  }
  // A backstop for a test process that ends without its teardown (an error in another
  // teardown, a timeout): no postmaster is left behind.
  const orphans = () => {
    for (const data of [replicaData, primaryData]) {
      try {
        const pid = Number(readFileSync(join(data, 'postmaster.pid'), 'utf8').split('\n')[0])
        // Never 0 or a negative number: those signal whole process groups.
        if (Number.isInteger(pid) && pid > 0) process.kill(pid, 'SIGQUIT')
      } catch { /* not running */ }
    }
  }
  process.once('exit', orphans)
  t.teardown(async () => {
    process.off('exit', orphans)
    await stop(replicaData)
    await stop(primaryData)
    rmSync(dir, { recursive: true, force: true })
  })

  await tool('initdb', ['-D', primaryData, '-A', 'trust', '-U', 'postgres', '--no-sync'])
  await start(primaryData, primaryPort, 'primary.log')
  await tool('createdb', ['-h', '127.0.0.1', '-p', String(primaryPort), '-U', 'postgres', 'parley'])
  // -R writes standby.signal and primary_conninfo: the copy starts as a standby streaming from it.
  await tool('pg_basebackup', ['-h', '127.0.0.1', '-p', String(primaryPort), '-U', 'postgres', '-D', replicaData, '-R', '-X', 'stream', '--checkpoint=fast', '--no-sync'])
  await start(replicaData, replicaPort, 'replica.log')

  const replicaUrl = `postgres://postgres@127.0.0.1:${replicaPort}/parley`
  const primaryUrl = `postgres://postgres@127.0.0.1:${primaryPort}/parley`
  const on = async (url: string, texts: string[]) => {
    const client = new pg.Client({ connectionString: url })
    await client.connect()
    try {
      let rows: Record<string, unknown>[] = []
      for (const text of texts) rows = (await client.query(text)).rows
      return rows
    } finally {
      await client.end()
    }
  }
  return {
    primaryUrl,
    replicaUrl,
    onReplica: async (text) => { await on(replicaUrl, [text]) },
    onPrimary: (...texts) => on(primaryUrl, texts),
    stopReplica: () => stop(replicaData),
    async startReplica () { await start(replicaData, replicaPort, 'replica.log') }
  }
}

export interface FreezableProxy {
  port: number
  /** From now on nothing passes either way, and new connections are accepted but never answered: a host gone quiet. */
  freeze(): void
  /** Connections that lost bytes while frozen are cut (their protocol state is lost); new ones pass again. */
  thaw(): void
}

/** A TCP proxy on loopback in front of `port`, to make the server behind it go quiet without a word. Closed at teardown. */
export async function freezableProxy (t: TestContext, port: number): Promise<FreezableProxy> {
  let frozen = false
  const spoiled = new Set<Socket>()
  const sockets = new Set<Socket>()
  const server = createServer((client) => {
    sockets.add(client)
    client.on('close', () => { sockets.delete(client); spoiled.delete(client) })
    client.on('error', () => {})
    if (frozen) {
      spoiled.add(client)
      return
    }
    const upstream = connect(port, '127.0.0.1')
    sockets.add(upstream)
    upstream.on('close', () => { sockets.delete(upstream); client.destroy() })
    upstream.on('error', () => client.destroy())
    client.on('close', () => upstream.destroy())
    const forward = (from: Socket, to: Socket) => from.on('data', (chunk: Buffer) => {
      if (frozen) spoiled.add(client)
      else to.write(chunk)
    })
    forward(client, upstream)
    forward(upstream, client)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(async () => {
    for (const socket of sockets) socket.destroy()
    await new Promise((resolve) => server.close(resolve))
  })
  return {
    port: (server.address() as { port: number }).port,
    freeze: () => { frozen = true },
    thaw: () => {
      frozen = false
      for (const socket of spoiled) socket.destroy()
      spoiled.clear()
    }
  }
}
