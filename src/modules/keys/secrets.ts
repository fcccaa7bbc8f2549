import { createHash, randomBytes, timingSafeEqual } from 'node:crypto'
import { newId } from '../../ids.js'

export function newKeyId (): string {
  return newId('key')
}

/** 32 random bytes, base64url: the only time the secret exists in clear is this return value. */
export function newSecret (): string {
  return `sk_${randomBytes(32).toString('base64url')}`
}

export function hashSecret (secret: string): string {
  return createHash('sha256').update(secret, 'utf8').digest('hex')
}

/** Compares a presented secret with a stored hash in time independent of where they differ. */
export function secretMatches (secret: string, storedHash: string): boolean {
  const presented = createHash('sha256').update(secret, 'utf8').digest()
  const stored = Buffer.from(storedHash, 'hex')
  return stored.length === presented.length && timingSafeEqual(presented, stored)
}
