import type { Db } from '../db/client.js'
import { NotFound, ValidationFailed } from '../errors.js'
import { isAddress, isGroupId, isMessageId, normalizeAddress } from '../ids.js'
import { createGroupsRepository } from './groups/groups.repository.js'
import { memberGroup } from './groups/groups.service.js'
import { readableMessage } from './messages/access.service.js'
import { createMessagesRepository } from './messages/messages.repository.js'
import { createUsersRepository } from './users/users.repository.js'

export type EntityKind = 'user' | 'group' | 'message'

/** What an `entity` path or field names (API.md §1), with who may see it and who owns it. */
export interface Entity {
  kind: EntityKind
  id: string
  /** The user (itself), the group's owner, or the message's sender. */
  owner: string
}

export function entityKind (entity: string): EntityKind {
  if (isGroupId(entity)) return 'group'
  if (isMessageId(entity)) return 'message'
  if (isAddress(normalizeAddress(entity))) return 'user'
  throw new ValidationFailed('entity: must be a user address, a group id (grp_…) or a message id (msg_…)')
}

/**
 * The entity as `viewer` may see it: users by everyone, groups by their members, messages by
 * their sender and recipients. Unknown 404; not visible 403.
 */
export async function visibleEntity (db: Db, entity: string, viewer: string): Promise<Entity> {
  const kind = entityKind(entity)
  if (kind === 'user') {
    const user = await createUsersRepository(db).find(entity)
    if (user === undefined) throw new NotFound('user', normalizeAddress(entity))
    return { kind, id: user.address, owner: user.address }
  }
  if (kind === 'group') {
    const group = await memberGroup(createGroupsRepository(db), entity, viewer)
    return { kind, id: group.id, owner: group.owner }
  }
  const { row } = await readableMessage(createMessagesRepository(db), entity, viewer)
  return { kind, id: row.id, owner: row.sender }
}
