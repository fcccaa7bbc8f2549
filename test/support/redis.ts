import { connect } from 'node:net'

/** True when something accepts connections on the machine's Redis port. */
export async function redisReachable (): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(6379, '127.0.0.1')
    socket.once('connect', () => { socket.destroy(); resolve(true) })
    socket.once('error', () => resolve(false))
  })
}
