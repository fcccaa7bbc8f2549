import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto'

const SEALED = 'sealed:v1:'

/**
 * How webhook signing secrets are kept. The service must be able to read a secret back (it
 * signs every delivery with it), so it cannot keep only a hash as it does for API keys. With
 * WEBHOOK_SECRETS_KEY set, each secret is sealed with AES-256-GCM under that key, bound to its
 * webhook's id, and the database holds only the sealed form: a dump or a backup reveals no
 * secret. Without the key, secrets are stored as they are, and the log says so once.
 */
export interface SecretBox {
  /** Whether secrets are sealed (a key is configured). */
  readonly sealing: boolean
  seal(webhookId: string, secret: string): string
  /** The secret, or an Error naming why it cannot be read (a sealed one without the right key). */
  open(webhookId: string, stored: string): string
}

export function createSecretBox (key: Buffer | undefined): SecretBox {
  return {
    sealing: key !== undefined,
    seal (webhookId, secret) {
      if (key === undefined) return secret
      const iv = randomBytes(12)
      const cipher = createCipheriv('aes-256-gcm', key, iv).setAAD(Buffer.from(webhookId))
      const sealed = Buffer.concat([cipher.update(secret, 'utf8'), cipher.final()])
      return `${SEALED}${iv.toString('base64url')}:${cipher.getAuthTag().toString('base64url')}:${sealed.toString('base64url')}`
    },
    open (webhookId, stored) {
      if (!stored.startsWith(SEALED)) return stored
      if (key === undefined) throw new Error('the signing secret is sealed and WEBHOOK_SECRETS_KEY is not set')
      const [iv = '', tag = '', sealed = ''] = stored.slice(SEALED.length).split(':')
      try {
        const decipher = createDecipheriv('aes-256-gcm', key, Buffer.from(iv, 'base64url')).setAAD(Buffer.from(webhookId))
        decipher.setAuthTag(Buffer.from(tag, 'base64url'))
        return Buffer.concat([decipher.update(Buffer.from(sealed, 'base64url')), decipher.final()]).toString('utf8')
      } catch {
        throw new Error('the signing secret was sealed with another WEBHOOK_SECRETS_KEY')
      }
    }
  }
}
