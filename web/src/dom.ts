/** Looks an element up by id; the page is ours, so a missing one is a bug. */
export function byId<T extends HTMLElement = HTMLElement> (id: string): T {
  const found = document.getElementById(id)
  if (found === null) throw new Error(`#${id} is missing from the page`)
  return found as T
}

type Child = Node | string | undefined

/**
 * Makes an element. Text is always set as text (never parsed as HTML), so message bodies and
 * names cannot inject markup or script.
 */
export function el<K extends keyof HTMLElementTagNameMap> (tag: K, attributes: Record<string, string> = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const element = document.createElement(tag)
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, value)
  for (const child of children) {
    if (child !== undefined) element.append(child)
  }
  return element
}

export function formatSize (bytes: number): string {
  if (bytes < 1024) return `${bytes} B`
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`
}
