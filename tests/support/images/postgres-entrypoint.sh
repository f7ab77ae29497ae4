#!/bin/sh
# First start: a cluster with the named database and owner; then the server on every address.
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    printf '%s\n' "$POSTGRES_PASSWORD" > /tmp/pwfile
    initdb --username="$POSTGRES_USER" --pwfile=/tmp/pwfile --auth-host=scram-sha-256 \
        --auth-local=trust "$PGDATA" >/dev/null
    rm /tmp/pwfile
    echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    createdb --username="$POSTGRES_USER" "$POSTGRES_DB" 2>/dev/null || true
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp
