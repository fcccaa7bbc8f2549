/**
 * A progress bar on stderr for the sealing commands: on a terminal one line redrawn in place
 * (at most ten times a second); otherwise, for logs, a plain line every tenth of the way or
 * every 10 seconds, whichever comes first.
 */
export function progressBar (write: (text: string) => void, tty: boolean) {
  const width = 30
  let drawn = 0
  let lastTenth = -1
  let lastLine = 0
  let shown = false
  return {
    update (label: string, done: number, total: number): void {
      const fraction = total === 0 ? 1 : Math.min(1, done / total)
      const now = Date.now()
      if (tty) {
        if (now - drawn < 100 && done < total) return
        drawn = now
        const filled = Math.round(fraction * width)
        write(`\r[${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${(fraction * 100).toFixed(0).padStart(3)}%  ${done}/${total}  ${label}\u001b[K`)
        shown = true
        return
      }
      const tenth = Math.floor(fraction * 10)
      if (tenth === lastTenth && now - lastLine < 10_000) return
      lastTenth = tenth
      lastLine = now
      write(`sealing: ${done}/${total} (${(fraction * 100).toFixed(0)}%) ${label}\n`)
    },
    /** Ends the redrawn line, so what follows starts on a line of its own. */
    end (): void {
      if (tty && shown) write('\n')
    }
  }
}
