import type { Db } from '../../db/client.js'
import { transaction } from '../../db/transaction.js'
import { NotFound, ValidationFailed } from '../../errors.js'
import { createEventsRepository } from '../events/events.repository.js'
import { readableMessage } from '../messages/access.service.js'
import { createMessagesRepository } from '../messages/messages.repository.js'
import { createConversationsRepository } from './conversations.repository.js'
import { idFloor, isAddress, isGroupId, normalizeAddress } from '../../ids.js'
import { memberGroup } from '../groups/groups.service.js'
import { createGroupsRepository } from '../groups/groups.repository.js'
import { createUsersRepository } from '../users/users.repository.js'

/** Messages sent this long before a member joined are still looked at (instances' clocks differ). */
const CLOCK_SKEW_MS = 60_000

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

/**
 * The least message id of others' that can have reached `viewer` in group `peer`: none sent
 * before it (last) joined, less CLOCK_SKEW_MS, since an id's time is its sending instance's
 * clock. A history page of the group starts its scan of others' messages no lower, so a member
 * who joined a long-lived group does not walk its whole past, message by message, to find
 * nothing. Undefined for a 1:1 conversation.
 */
export async function deliveredSince (db: Db, viewer: string, peer: string): Promise<string | undefined> {
  if (!isGroupId(peer)) return undefined
  const joined = await createGroupsRepository(db).joinedAt(peer, viewer)
  return joined === undefined ? undefined : idFloor('msg', joined.getTime() - CLOCK_SKEW_MS)
}

/**
 * POST /conversations/{peer}/read: every message from others in the caller's conversation with
 * `peer` up to and including `upTo` becomes read for the caller (forward only). `upTo` is a
 * message of that conversation the caller may read (404 unknown, 403 not the caller's to read,
 * 400 of another conversation). Each sender with messages marked gets one conversation.read,
 * naming the conversation as it would (the reader, or the group), in the same transaction.
 */
export async function readConversation (db: Db, viewer: string, peerParam: string, upTo: string): Promise<void> {
  const peer = await conversationPeer(db, viewer, peerParam)
  const { row } = await readableMessage(createMessagesRepository(db), upTo, viewer)
  const inConversation = peer.startsWith('grp_')
    ? row.recipient === peer
    : (row.sender === viewer && row.recipient === peer) || (row.sender === peer && row.recipient === viewer)
  if (!inConversation) throw new ValidationFailed(`upTo: message ${upTo} is not in the conversation with ${peer}`)
  await transaction(db, async (tx) => {
    const senders = await createConversationsRepository(tx).markRead(viewer, peer, upTo)
    const conversation = peer.startsWith('grp_') ? peer : viewer
    await createEventsRepository(tx).append(senders.map((sender) => ({
      address: sender, type: 'conversation.read', data: { reader: viewer, conversation, upTo }
    })))
  })
}
