import { AppError, Forbidden } from '../../errors.js'
import { quotaHeaders, type QuotaState } from '../quota/quota.repository.js'

export class QuotaExceeded extends AppError {
  constructor (state: QuotaState) {
    super(429, 'QUOTA_EXCEEDED', `Daily message quota of ${state.limit} reached; contact the operator for higher volume`, {
      ...quotaHeaders(state),
      'retry-after': String(Math.max(1, state.resetAt - Math.floor(Date.now() / 1000)))
    })
  }
}

/** A message or typing to a user an operator deactivated: refused, naming why (API.md §9). */
export class RecipientDeactivated extends Forbidden {
  constructor (address: string) {
    super(`user ${address} is deactivated and receives nothing`)
  }
}

export class IdempotencyMismatch extends AppError {
  constructor (key: string) {
    super(422, 'IDEMPOTENCY_MISMATCH', `Idempotency-Key ${JSON.stringify(key)} was already used with different fields`)
  }
}

export class IdempotencyInProgress extends AppError {
  constructor (key: string) {
    super(409, 'IDEMPOTENCY_IN_PROGRESS', `Idempotency-Key ${JSON.stringify(key)} is in use by a send still in flight; retry once it has finished`)
  }
}

export class IdempotentMessageDeleted extends AppError {
  constructor (messageId: string) {
    super(404, 'NOT_FOUND', `message ${messageId} sent with this Idempotency-Key was deleted`)
  }
}
