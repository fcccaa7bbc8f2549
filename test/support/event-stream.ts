/** An event as GET /v2/events/stream sends it. */
interface SseEvent { id: string, event: string, data: { id: string, type: string, data: { message?: { body: string } } } }

/** Opens a stream and parses it: events as they come, comment lines counted. */
export async function openStream (url: string, authorization: string, headers: Record<string, string> = {}) {
  const controller = new AbortController()
  const res = await fetch(url, { headers: { authorization, ...headers }, signal: controller.signal })
  const received: SseEvent[] = []
  let comments = 0
  let endedAt: number | undefined
  let waiters: (() => void)[] = []
  const done = (async () => {
    if (res.body === null) return
    const decoder = new TextDecoder()
    let buffer = ''
    try {
      for await (const chunk of res.body) {
        buffer += decoder.decode(chunk as Uint8Array, { stream: true })
        let end
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const block = buffer.slice(0, end)
          buffer = buffer.slice(end + 2)
          if (block.startsWith(':')) { comments++; continue }
          const fields = Object.fromEntries(block.split('\n').map((line) => [line.slice(0, line.indexOf(':')), line.slice(line.indexOf(':') + 2)]))
          received.push({ id: fields.id!, event: fields.event!, data: JSON.parse(fields.data!) })
        }
        for (const w of waiters) w()
        waiters = []
      }
    } catch { /* aborted, or cut off by the server */ }
    endedAt = Date.now()
  })()
  return {
    res,
    received,
    comments: () => comments,
    /** When the stream ended (closed by the server, or aborted here); undefined while open. */
    endedAt: () => endedAt,
    close: () => controller.abort(),
    done,
    async until (check: () => boolean, ms = 5_000) {
      const deadline = Date.now() + ms
      while (!check() && Date.now() < deadline) {
        await Promise.race([new Promise<void>((resolve) => waiters.push(resolve)), new Promise((resolve) => setTimeout(resolve, 100))])
      }
      return check()
    }
  }
}
