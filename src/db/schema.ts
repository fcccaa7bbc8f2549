export * from './settings.table.js'
export * from '../modules/users/users.table.js'
export * from '../modules/keys/keys.table.js'
