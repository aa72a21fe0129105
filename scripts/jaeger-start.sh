#!/usr/bin/env bash
# Starts a local Jaeger v2 (in-memory storage, every listener on 127.0.0.1) for development
# and tests, built from the version pinned in tools/jaeger/go.mod. Idempotent: if our Jaeger
# is already running and healthy it does nothing.
#
#   scripts/jaeger-start.sh          # build if needed, start, wait until healthy
#   scripts/jaeger-stop.sh           # stop it again
#
# Environment:
#   JAEGER_START_TIMEOUT  seconds to wait for health (default 60)
#   JAEGER_REBUILD=1      rebuild the binary even if it is up to date
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="$root/.cache"
bin="$cache/bin/jaeger"
pidfile="$cache/jaeger.pid"
logfile="$cache/jaeger.log"
config="$root/tools/jaeger/config.yaml"
health_url="http://127.0.0.1:13133/status"
query_url="http://127.0.0.1:16686/api/services"
timeout="${JAEGER_START_TIMEOUT:-60}"

mkdir -p "$cache/bin"
# The cache holds a 100+ MB binary, logs and a pid file: never commit any of it, whatever
# the repository's own .gitignore says.
[ -f "$cache/.gitignore" ] || printf '*\n' >"$cache/.gitignore"

# is_ours PID: the process exists and is the binary this script starts.
is_ours() {
	local pid="$1" argv0
	kill -0 "$pid" 2>/dev/null || return 1
	if [ -r "/proc/$pid/cmdline" ]; then
		argv0="$(tr '\0' '\n' <"/proc/$pid/cmdline" | head -n 1)"
	else
		argv0="$(ps -p "$pid" -o command= 2>/dev/null | awk '{print $1}')"
	fi
	[ "$argv0" = "$bin" ]
}

healthy() {
	curl -fsS -o /dev/null --max-time 2 "$health_url" 2>/dev/null &&
		curl -fsS -o /dev/null --max-time 2 "$query_url" 2>/dev/null
}

command -v curl >/dev/null || { echo "jaeger-start: curl is required" >&2; exit 1; }

if [ -f "$pidfile" ]; then
	pid="$(cat "$pidfile")"
	if is_ours "$pid"; then
		if healthy; then
			echo "jaeger-start: already running (pid $pid), UI/API http://127.0.0.1:16686"
			exit 0
		fi
		echo "jaeger-start: pid $pid is running but not healthy; waiting" >&2
	else
		echo "jaeger-start: removing stale pid file (pid $pid is not our jaeger)" >&2
		rm -f "$pidfile"
	fi
fi

if [ ! -f "$pidfile" ]; then
	if healthy; then
		# Something else (another checkout, a container) already serves these ports; starting
		# ours would only fail to bind. Use it, but do not claim it: jaeger-stop leaves it alone.
		echo "jaeger-start: a Jaeger not started by this script already answers on 127.0.0.1:16686; using it"
		exit 0
	fi

	# go build is incremental, but linking a binary this size still takes seconds: skip it
	# when the binary is newer than the pinned versions.
	if [ "${JAEGER_REBUILD:-0}" = 1 ] || [ ! -x "$bin" ] ||
		[ "$root/tools/jaeger/go.mod" -nt "$bin" ] || [ "$root/tools/jaeger/go.sum" -nt "$bin" ]; then
		echo "jaeger-start: building jaeger (first build downloads and compiles for a few minutes)"
		start_build=$(date +%s)
		(cd "$root/tools/jaeger" && go build -o "$bin" github.com/jaegertracing/jaeger/cmd/jaeger)
		echo "jaeger-start: built $bin in $(($(date +%s) - start_build))s"
	fi

	# setsid detaches Jaeger from the caller's process group, so a Ctrl-C in the terminal
	# that ran make does not kill it; it lives until jaeger-stop.
	launcher=()
	command -v setsid >/dev/null && launcher=(setsid)
	cd "$cache"
	"${launcher[@]}" "$bin" --config "file:$config" >>"$logfile" 2>&1 </dev/null &
	pid=$!
	echo "$pid" >"$pidfile"
	cd - >/dev/null
	echo "jaeger-start: started pid $pid, log $logfile"
fi

pid="$(cat "$pidfile")"
deadline=$(($(date +%s) + timeout))
until healthy; do
	if ! kill -0 "$pid" 2>/dev/null; then
		echo "jaeger-start: jaeger (pid $pid) exited; last log lines:" >&2
		tail -n 20 "$logfile" >&2 || true
		rm -f "$pidfile"
		exit 1
	fi
	if [ "$(date +%s)" -ge "$deadline" ]; then
		echo "jaeger-start: jaeger (pid $pid) not healthy after ${timeout}s ($health_url, $query_url); see $logfile" >&2
		exit 1
	fi
	sleep 0.5
done
echo "jaeger-start: healthy; OTLP http://127.0.0.1:4318 grpc 127.0.0.1:4317, UI/API http://127.0.0.1:16686"
