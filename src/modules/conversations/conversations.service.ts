import type { Db } from '../../db/client.js'
import { NotFound, ValidationFailed } from '../../errors.js'
import { isAddress, isGroupId, normalizeAddress } from '../../ids.js'
import { memberGroup } from '../groups/groups.service.js'
import { createGroupsRepository } from '../groups/groups.repository.js'
import { createUsersRepository } from '../users/users.repository.js'

/**
 * The conversation `peer` names, as the caller may page it: a group it belongs to (unknown 404,
 * not a member 403, as GET /group/{id}), or a user that exists (404 otherwise; its address
 * case-insensitive). Answers the peer as stored.
 */
export async function conversationPeer (db: Db, viewer: string, peer: string): Promise<string> {
  if (isGroupId(peer)) {
    await memberGroup(createGroupsRepository(db), peer, viewer)
    return peer
  }
  const address = normalizeAddress(peer)
  if (!isAddress(address)) throw new ValidationFailed(`peer: ${JSON.stringify(peer)} is neither a user address nor a group id (grp_…)`)
  if (await createUsersRepository(db).find(address) === undefined) throw new NotFound('user', address)
  return address
}
