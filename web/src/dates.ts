// Times as the console shows them, in the reader's own time zone and language.

/** The local calendar day of an instant, as a key that compares like the day (YYYY-MM-DD). */
export function dayKey (when: Date | string): string {
  const d = typeof when === 'string' ? new Date(when) : when
  return `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, '0')}-${String(d.getDate()).padStart(2, '0')}`
}

/** "Today", "Yesterday", or the date (with the year only when it is not this year's). */
export function dayLabel (iso: string, now = new Date()): string {
  const day = dayKey(iso)
  if (day === dayKey(now)) return 'Today'
  const yesterday = new Date(now)
  yesterday.setDate(now.getDate() - 1)
  if (day === dayKey(yesterday)) return 'Yesterday'
  const date = new Date(iso)
  return date.toLocaleDateString([], {
    weekday: 'short',
    day: 'numeric',
    month: 'short',
    ...(date.getFullYear() === now.getFullYear() ? {} : { year: 'numeric' })
  })
}

export function formatTime (iso: string): string {
  return new Date(iso).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' })
}

/** The full date and time, for a tooltip. */
export function formatDateTime (iso: string): string {
  return new Date(iso).toLocaleString([], { dateStyle: 'full', timeStyle: 'short' })
}

/** When, in a list: the time for today, else the day. */
export function formatWhen (iso: string, now = new Date()): string {
  return dayKey(iso) === dayKey(now) ? formatTime(iso) : dayLabel(iso, now)
}
