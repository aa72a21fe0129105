#!/usr/bin/env bash
# PostgreSQL for sluice's tests (the outbox's SQL forwarder), from a data folder of this
# checkout's own, beside whatever PostgreSQL the machine runs and never touching it: no
# system cluster is started, configured or given a database. The server binaries are the
# machine's (Debian's postgresql package: /usr/lib/postgresql/N/bin); the data folder is
# .cache/postgres/data, made once with initdb (trust authentication, 127.0.0.1 only, the
# socket in .cache/postgres/run), and the server listens on a port of its own on 127.0.0.1
# (5433, or the next free one), recorded in .cache/postgres/port for the next start.
#
#   scripts/postgres.sh start    initdb if needed, start, create the database "test", print
#                                the URL (running: prints it)
#   scripts/postgres.sh stop     stop it (the data folder stays for the next start)
#   scripts/postgres.sh url      the URL the tests use (POSTGRES_URL)
#   scripts/postgres.sh status   running or not, and where
#
# initdb and the server refuse to run as root: run as root, they run as the postgres user
# (nobody where there is none), which then owns the data folder. Run as another user, they
# run as that user.
#
# Environment:
#   SLUICE_POSTGRES_DIR   the folder (default <repo>/.cache/postgres, or one under /tmp
#                         when the server's user cannot reach the checkout)
#   SLUICE_POSTGRES_PORT  the port to use instead of 5433 or the next free one
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { echo "postgres: $*"; }
die() {
	echo "postgres: $*" >&2
	exit 1
}
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The user the server runs as.
if [ "$(id -u)" = 0 ]; then
	user=postgres
	id "$user" >/dev/null 2>&1 || user=nobody
	as() { runuser -u "$user" -- "$@"; }
else
	user="$(id -un)"
	as() { "$@"; }
fi

dir="${SLUICE_POSTGRES_DIR:-$repo/.cache/postgres}"
# Run as root, the server's user must reach the folder: a checkout under a private home
# (/root is 0700) gets one under /tmp instead, named after it.
if [ -z "${SLUICE_POSTGRES_DIR:-}" ] && [ "$(id -u)" = 0 ] && ! runuser -u "$user" -- test -x "$repo" 2>/dev/null; then
	dir="/tmp/sluice-postgres-$(printf '%s' "$repo" | md5sum | cut -c1-12)"
fi
data="$dir/data"
run="$dir/run"
log="$dir/postgres.log"

# bin: the newest PostgreSQL server binaries on the machine.
bin=""
for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
	[ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && {
		bin="$d"
		break
	}
done
if [ -z "$bin" ] && command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
	bin="$(dirname "$(command -v pg_ctl)")"
fi

port() {
	if [ -n "${SLUICE_POSTGRES_PORT:-}" ]; then
		echo "$SLUICE_POSTGRES_PORT"
	elif [ -s "$dir/port" ]; then
		cat "$dir/port"
	else
		echo 5433
	fi
}

url() { echo "postgres://postgres@127.0.0.1:$(port)/test?sslmode=disable"; }

running() {
	[ -n "$bin" ] && [ -f "$data/postmaster.pid" ] && as "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1
}

start() {
	[ -n "$bin" ] || die "no PostgreSQL server binaries (initdb, pg_ctl) on this machine: install Debian's postgresql package"
	if running; then
		say "running on 127.0.0.1:$(port) (data $data)"
		url
		return
	fi
	mkdir -p "$dir"
	# The data, the logs and the socket are never to be committed, whatever .gitignore says.
	[ -f "$dir/.gitignore" ] || printf '*\n' >"$dir/.gitignore"
	if [ ! -f "$data/PG_VERSION" ]; then
		rm -rf "$data"
		mkdir -p "$data"
		chown "$user:" "$data" 2>/dev/null || true
		chmod 700 "$data"
		say "initdb $data (once; PostgreSQL $("$bin/postgres" --version | awk '{print $3}'), as $user)"
		as "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1 ||
			{
				tail -20 "$dir/initdb.log" >&2
				die "initdb failed (log: $dir/initdb.log)"
			}
	fi
	mkdir -p "$run"
	: >>"$log"
	chown "$user:" "$run" "$log" 2>/dev/null || true
	# A port of its own: the recorded one when it is free, else 5433 or the next free one.
	local p
	p="$(port)"
	if port_open "$p"; then
		[ -n "${SLUICE_POSTGRES_PORT:-}" ] && die "port $p (SLUICE_POSTGRES_PORT) is in use: $(who_listens "$p")"
		p=5433
		while port_open "$p"; do p=$((p + 1)); done
	fi
	echo "$p" >"$dir/port"
	# Test data only: durability is traded for speed (no fsync), every listener on 127.0.0.1.
	if ! as "$bin/pg_ctl" -D "$data" -l "$log" -w -t 60 \
		-o "-p $p -h 127.0.0.1 -k $run -c fsync=off -c synchronous_commit=off -c full_page_writes=off" start >/dev/null; then
		tail -20 "$log" >&2
		die "PostgreSQL did not start on 127.0.0.1:$p (log: $log)"
	fi
	if ! as "$bin/psql" -h "$run" -p "$p" -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" | grep -q 1; then
		as "$bin/createdb" -h "$run" -p "$p" -U postgres test || die "createdb test failed"
	fi
	say "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$p (data $data, as $user)"
	url
}

stop() {
	running || return 0
	as "$bin/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null
	say "stopped"
}

# who_listens PORT: the process listening on 127.0.0.1:PORT, as ss names it.
who_listens() {
	ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'users:(([^)]*))' | head -1 || echo "unknown process"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
url) url ;;
status)
	if running; then say "running on 127.0.0.1:$(port) (data $data)"; else say "not running (data $data)"; fi
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 2
	;;
esac
