import { byId } from './dom.js'

/** The page's elements (web/index.html), looked up once when the script loads. */
export const signInView = byId('sign-in-view')
export const consoleView = byId('console-view')
export const signInForm = byId<HTMLFormElement>('sign-in-form')
export const signInError = byId('sign-in-error')
export const conversationList = byId<HTMLUListElement>('conversations')
export const messageList = byId<HTMLOListElement>('messages')
export const threadTitle = byId('thread-title')
export const typingLine = byId('typing')
export const composer = byId<HTMLFormElement>('composer')
export const recipientInput = composer.elements.namedItem('recipient') as HTMLInputElement
export const bodyInput = composer.elements.namedItem('body') as HTMLTextAreaElement
export const fileInput = composer.elements.namedItem('attachment') as HTMLInputElement
export const sendError = byId('send-error')
export const connection = byId('connection')
export const composing = byId('composing')
export const composingText = byId('composing-text')
export const sendButton = byId<HTMLButtonElement>('send')
