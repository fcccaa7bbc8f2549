/**
 * `attachment` with the name in both forms of RFC 6266: an ASCII fallback with quotes,
 * backslashes and anything non-printable replaced, and the exact name percent-encoded per
 * RFC 5987. Nothing from the upload can break out of the header.
 */
export function contentDisposition (filename: string): string {
  const fallback = filename.replace(/[^\x20-\x7e]|["\\%;]/g, '_')
  const encoded = encodeURIComponent(filename).replace(/['()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`)
  return `attachment; filename="${fallback}"; filename*=UTF-8''${encoded}`
}
