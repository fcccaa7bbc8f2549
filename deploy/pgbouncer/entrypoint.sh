#!/bin/sh
# Writes a PgBouncer configuration from the environment and runs PgBouncer on it: one database
# (PGBOUNCER_DATABASE) on one PostgreSQL server, transaction pooling, SCRAM authentication of
# one user whose password both PgBouncer and PostgreSQL check. The compose file's `pgbouncer`
# service runs it; test/operations/compose.test.ts runs it too, in front of the test PostgreSQL.
set -eu

: "${PGBOUNCER_PASSWORD:?set PGBOUNCER_PASSWORD (the compose file passes POSTGRES_PASSWORD)}"
database=${PGBOUNCER_DATABASE:-parley}
user=${PGBOUNCER_USER:-parley}
dir=${PGBOUNCER_CONFIG_DIR:-/tmp/pgbouncer}

umask 077
mkdir -p "$dir"
# userlist.txt quotes names and passwords in double quotes, a double quote doubled.
quote() { printf '"%s"' "$(printf '%s' "$1" | sed 's/"/""/g')"; }
printf '%s %s\n' "$(quote "$user")" "$(quote "$PGBOUNCER_PASSWORD")" > "$dir/userlist.txt"
cat > "$dir/pgbouncer.ini" <<INI
[databases]
$database = host=${PGBOUNCER_UPSTREAM_HOST:-postgres} port=${PGBOUNCER_UPSTREAM_PORT:-5432} dbname=$database

[pgbouncer]
listen_addr = ${PGBOUNCER_LISTEN_ADDR:-0.0.0.0}
listen_port = ${PGBOUNCER_LISTEN_PORT:-6432}
unix_socket_dir =
logfile =
pidfile =
auth_type = scram-sha-256
auth_file = $dir/userlist.txt
; A server connection is lent for one transaction, then goes back to the pool: session state
; (LISTEN, SET, advisory locks, named prepared statements) does not survive between two.
; Parley keeps LISTEN/NOTIFY and migrations on DATABASE_DIRECT_URL, straight to PostgreSQL.
pool_mode = transaction
; Server connections per database and user: what PostgreSQL's max_connections must hold, next
; to each instance's direct connection (docs/operations.md, "Sizing").
default_pool_size = ${PGBOUNCER_DEFAULT_POOL_SIZE:-20}
reserve_pool_size = ${PGBOUNCER_RESERVE_POOL_SIZE:-0}
; Client connections: at least the app instances times DATABASE_POOL_SIZE.
max_client_conn = ${PGBOUNCER_MAX_CLIENT_CONN:-1000}
ignore_startup_parameters = extra_float_digits
; The app's user may read SHOW POOLS / SHOW STATS on the admin console (database pgbouncer):
; cl_waiting and maxwait are what docs/operations.md says to watch.
stats_users = $user
log_connections = 0
log_disconnections = 0
INI

# PgBouncer refuses to run as root: as root (the test suite), drop to the postgres user.
if [ "$(id -u)" = 0 ]; then
  chown -R postgres "$dir"
  exec pgbouncer -u postgres "$dir/pgbouncer.ini"
fi
exec pgbouncer "$dir/pgbouncer.ini"
