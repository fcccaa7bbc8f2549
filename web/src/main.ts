import { ApiError, createApi, describe, type Credentials } from './api.js'
import { cancelComposing, send, typed } from './composer.js'
import { byId } from './dom.js'
import { follow, nameGroup } from './feed.js'
import { bodyInput, composer, consoleView, messageList, signInError, signInForm, signInView } from './page.js'
import { loadOlder, markVisible, newConversation, renderConversations, renderThread, showList } from './render.js'
import { clearCredentials, loadCredentials, saveCredentials, showSignIn, signOut, startSession } from './session.js'

// The console's entry point: signing in, and the page's events wired to the modules that handle them.

async function signIn (credentials: Credentials): Promise<void> {
  const api = createApi(credentials)
  let whoami
  try {
    whoami = await api.whoami()
  } catch (err) {
    clearCredentials()
    showSignIn(err instanceof ApiError && err.status === 401 ? 'Wrong key id or secret, or the key was revoked.' : `Could not sign in: ${describe(err)}`)
    return
  }
  saveCredentials(credentials)
  const me = whoami.user.address
  const s = startSession(api, me)
  byId('signed-in-as').textContent = me
  signInView.hidden = true
  consoleView.hidden = false
  signInForm.reset()

  const roster = await api.roster().catch(() => ({ entries: [] }))
  for (const entry of roster.entries) {
    const conversation = s.conversations.get(entry.entity)
    conversation.title = entry.name ?? entry.entity
    if (entry.type === 'group' && entry.name === null) void nameGroup(s, entry.entity)
  }
  renderConversations()
  void follow(s)
}

signInForm.addEventListener('submit', (event) => {
  event.preventDefault()
  const data = new FormData(signInForm)
  signInError.textContent = ''
  void signIn({ keyId: String(data.get('keyId') ?? '').trim(), secret: String(data.get('secret') ?? '') })
})
byId('sign-out').addEventListener('click', () => signOut())
composer.addEventListener('submit', (event) => {
  event.preventDefault()
  void send()
})
bodyInput.addEventListener('input', typed)
bodyInput.addEventListener('keydown', (event) => {
  if (event.key === 'Enter' && !event.shiftKey) {
    event.preventDefault()
    composer.requestSubmit()
  }
})
bodyInput.addEventListener('keydown', (event) => { if (event.key === 'Escape') cancelComposing() })
byId('cancel-composing').addEventListener('click', cancelComposing)
byId('back').addEventListener('click', showList)
byId('new-conversation').addEventListener('click', newConversation)
messageList.addEventListener('scroll', () => {
  markVisible()
  void loadOlder()
})
document.addEventListener('visibilitychange', () => { if (document.visibilityState === 'visible') renderThread() })

const stored = loadCredentials()
if (stored !== undefined) void signIn(stored)
else showSignIn()
