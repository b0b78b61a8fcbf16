#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests, on loopback only.
#
#   .ci/postgres.sh start DIR   initialise a cluster in DIR (a fresh, empty directory), start
#                               it on 127.0.0.1 on a free port, print the port
#   .ci/postgres.sh stop DIR    stop it (if running) and delete DIR
#
# Trust authentication is used: the server listens only on 127.0.0.1 and on a unix socket
# inside DIR, and lives only as long as one test run. initdb refuses to run as root, so as
# root the server runs as the `postgres` user. PG_BIN overrides where the binaries are.
set -euo pipefail

PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}

as_owner() {
    # Run a command as the user that owns the server: `postgres` when we are root.
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

start() {
    local dir=$1
    if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ] || [ ! -x "$PG_BIN/pg_ctl" ]; then
        echo "postgres.sh: PostgreSQL server binaries (initdb, pg_ctl) not found in" \
             "${PG_BIN:-/usr/lib/postgresql/*/bin}; install PostgreSQL or set PG_BIN:" \
             "the tests need a PostgreSQL server" >&2
        return 1
    fi
    mkdir -p "$dir"
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$dir"
    fi
    as_owner "$PG_BIN/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C \
        --no-sync >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
    # Durability is not needed for a throwaway server; speed is.
    local opts="-c listen_addresses=127.0.0.1 -k $dir -c fsync=off -c synchronous_commit=off"
    opts+=" -c full_page_writes=off -c max_connections=200"
    local port tries=0
    until port=$(free_port) && as_owner "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" \
            -w -t 60 -o "$opts -p $port" start >/dev/null; do
        tries=$((tries + 1))  # the port may have been taken between choosing and binding
        if [ "$tries" -ge 3 ]; then
            cat "$dir/server.log" >&2
            return 1
        fi
    done
    echo "$port"
}

stop() {
    local dir=$1
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_owner "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null || true
    fi
    rm -rf "$dir"
}

case "${1:-}" in
    start) start "${2:?usage: postgres.sh start DIR}" ;;
    stop) stop "${2:?usage: postgres.sh stop DIR}" ;;
    *) echo "usage: postgres.sh start|stop DIR" >&2; exit 2 ;;
esac
