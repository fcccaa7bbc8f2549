import { lookup as dnsLookup, type LookupAddress } from 'node:dns'
import { BlockList, isIP, type LookupFunction } from 'node:net'
import { ValidationFailed } from '../../errors.js'

/**
 * Where no webhook may point unless WEBHOOK_ALLOW_PRIVATE=true: every block of IANA's IPv4 and
 * IPv6 Special-Purpose Address Registries that is not globally reachable (checked against the
 * registries as of 2026-11: RFC 6890 and its updates), plus multicast and the reserved IPv4 space,
 * and for IPv6 everything outside global unicast 2000::/3.
 */
// Two lists: Node checks an IPv4 address against a list's IPv6 rules too (as ::ffff:a.b.c.d), so
// the IPv6 rules that cover whole IPv4-carrying prefixes must not see IPv4 addresses.
const PRIVATE_V4 = new BlockList()
const GLOBAL_V6 = new BlockList()
const PRIVATE_V6 = new BlockList()
for (const [net, bits] of [
  // This network, private, shared (CGN), loopback, link-local (cloud metadata at 169.254.169.254),
  // private, IETF protocol assignments (with DS-Lite, NAT64 discovery, PCP/TURN anycast),
  // TEST-NET-1, the deprecated 6to4 relay anycast (RFC 7526: reaches whatever relay answers),
  // private, benchmarking, TEST-NET-2 and -3, multicast, reserved and the limited broadcast.
  ['0.0.0.0', 8], ['10.0.0.0', 8], ['100.64.0.0', 10], ['127.0.0.0', 8], ['169.254.0.0', 16], ['172.16.0.0', 12],
  ['192.0.0.0', 24], ['192.0.2.0', 24], ['192.88.99.0', 24], ['192.168.0.0', 16], ['198.18.0.0', 15], ['198.51.100.0', 24],
  ['203.0.113.0', 24], ['224.0.0.0', 4], ['240.0.0.0', 4]
] as const) PRIVATE_V4.addSubnet(net, bits, 'ipv4')
// Only global unicast is public; everything else (loopback ::1, unspecified ::, IPv4-compatible
// ::/96, mapped ::ffff:0:0/96, IPv4-translated ::ffff:0:0:0/96, NAT64 64:ff9b::/96 and
// 64:ff9b:1::/48, discard 100::/64, the dummy prefix 100:0:0:1::/64, SRv6 SIDs 5f00::/16,
// unique-local fc00::/7, link-local fe80::/10, site-local fec0::/10, multicast ff00::/8, and
// whatever is assigned out there later) is refused by not being in 2000::/3.
GLOBAL_V6.addSubnet('2000::', 3, 'ipv6')
// Inside it: IETF protocol assignments 2001::/23 (Teredo 2001::/32, benchmarking 2001:2::/48,
// ORCHID), documentation 2001:db8::/32 and 3fff::/20, and 6to4 2002::/16, which carry or reach
// an IPv4 address through a gateway. The blocks outside 2000::/3 are listed too, so they stay
// refused whatever becomes of the rule above.
for (const [net, bits] of [
  ['::', 96], ['::ffff:0:0', 96], ['::ffff:0:0:0', 96], ['64:ff9b::', 96], ['64:ff9b:1::', 48], ['100::', 64],
  ['100:0:0:1::', 64], ['2001::', 23], ['2001:db8::', 32], ['2002::', 16], ['3fff::', 20], ['5f00::', 8],
  ['fc00::', 7], ['fe80::', 10], ['fec0::', 10], ['ff00::', 8]
] as const) PRIVATE_V6.addSubnet(net, bits, 'ipv6')

/** Whether an IP address is one a webhook may not reach (see PRIVATE_V4, GLOBAL_V6 and PRIVATE_V6). */
export function isPrivateAddress (address: string): boolean {
  const family = isIP(address)
  if (family === 0) return true
  if (family === 4) return PRIVATE_V4.check(address, 'ipv4')
  return !GLOBAL_V6.check(address, 'ipv6') || PRIVATE_V6.check(address, 'ipv6')
}

/** A URL fit to be a webhook's: https (http too where private targets are allowed), no credentials, 2,048 characters at most. */
export function parseWebhookUrl (text: string, allowPrivate: boolean): URL {
  let url: URL
  try {
    url = new URL(text)
  } catch {
    throw new ValidationFailed('url: not an absolute URL')
  }
  if (url.protocol !== 'https:' && !(allowPrivate && url.protocol === 'http:')) {
    throw new ValidationFailed(allowPrivate ? 'url: must be https:// or http://' : 'url: must be https:// (http:// only with WEBHOOK_ALLOW_PRIVATE=true)')
  }
  if (url.username !== '' || url.password !== '') throw new ValidationFailed('url: must not carry credentials')
  if (text.length > 2048) throw new ValidationFailed('url: at most 2048 characters')
  url.hash = ''
  return url
}

function resolveAll (host: string): Promise<LookupAddress[]> {
  return new Promise((resolve, reject) => {
    dnsLookup(host, { all: true, verbatim: true }, (err, addresses) => err === null ? resolve(addresses) : reject(err))
  })
}

/**
 * Checks where a webhook URL leads before it is saved: every address its host resolves to must
 * be public (unless allowed). The same check runs again at each delivery, as the connection is
 * made (see guardedLookup), since a name can resolve elsewhere later.
 */
export async function checkWebhookTarget (url: URL, allowPrivate: boolean): Promise<void> {
  if (allowPrivate) return
  const host = url.hostname.replace(/^\[|\]$/g, '')
  let addresses: LookupAddress[]
  try {
    addresses = isIP(host) === 0 ? await resolveAll(host) : [{ address: host, family: isIP(host) }]
  } catch {
    throw new ValidationFailed(`url: the host ${host} does not resolve`)
  }
  if (addresses.some((a) => isPrivateAddress(a.address))) {
    // The address a name resolves to is not told: the answer would make this an oracle of
    // what any name resolves to on the server's network (an internal DNS, say).
    throw new ValidationFailed(isIP(host) === 0
      ? `url: ${host} resolves to a non-public address (private, loopback, link-local or reserved; allowed only with WEBHOOK_ALLOW_PRIVATE=true)`
      : `url: ${host} is a non-public address (private, loopback, link-local or reserved; allowed only with WEBHOOK_ALLOW_PRIVATE=true)`)
  }
}

/** A `lookup` for outgoing requests that refuses private addresses at connect time (DNS rebinding). */
export function guardedLookup (allowPrivate: boolean): LookupFunction {
  return (hostname, options, callback) => {
    dnsLookup(hostname, options, (err, address, family) => {
      if (err !== null) return callback(err, '', 0)
      const addresses = Array.isArray(address) ? address as LookupAddress[] : [{ address, family: family ?? 4 }]
      const refused = allowPrivate ? undefined : addresses.find((a) => isPrivateAddress(a.address))
      // Its owner reads this in the delivery log: the address is not told (see checkWebhookTarget).
      if (refused !== undefined) return callback(new Error(`${hostname} resolves to a non-public address`), '', 0)
      // Node asks with all: true for happy eyeballs; hand back the shape it asked for.
      if (Array.isArray(address)) (callback as unknown as (e: null, a: LookupAddress[]) => void)(null, addresses)
      else callback(null, address, family)
    })
  }
}
