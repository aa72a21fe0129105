#!/usr/bin/env bash
# Stops the Jaeger that scripts/jaeger-start.sh started: exactly the process whose pid it
# recorded, and only if that pid is still our jaeger binary (a recycled pid is left alone).
#
# Environment:
#   JAEGER_STOP_TIMEOUT  seconds to wait after SIGTERM before SIGKILL (default 15)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/.cache/bin/jaeger"
pidfile="$root/.cache/jaeger.pid"
timeout="${JAEGER_STOP_TIMEOUT:-15}"

if [ ! -f "$pidfile" ]; then
	rm -f "$root/.cache/jaeger.env"
	echo "jaeger-stop: not running (no $pidfile)"
	exit 0
fi
pid="$(cat "$pidfile")"
case "$pid" in
'' | *[!0-9]*)
	echo "jaeger-stop: $pidfile holds no pid ('$pid'); removing it" >&2
	rm -f "$pidfile"
	exit 0
	;;
esac

is_ours() {
	local argv0
	kill -0 "$pid" 2>/dev/null || return 1
	if [ -r "/proc/$pid/cmdline" ]; then
		argv0="$(tr '\0' '\n' <"/proc/$pid/cmdline" | head -n 1)"
	else
		argv0="$(ps -p "$pid" -o command= 2>/dev/null | awk '{print $1}')"
	fi
	[ "$argv0" = "$bin" ]
}

if ! is_ours; then
	echo "jaeger-stop: pid $pid is not running our jaeger; removing stale $pidfile"
	rm -f "$pidfile"
	exit 0
fi

kill -TERM "$pid"
deadline=$(($(date +%s) + timeout))
while is_ours; do
	if [ "$(date +%s)" -ge "$deadline" ]; then
		echo "jaeger-stop: pid $pid still running after ${timeout}s; sending SIGKILL" >&2
		kill -KILL "$pid" 2>/dev/null || true
		break
	fi
	sleep 0.2
done
rm -f "$pidfile" "$root/.cache/jaeger.env"
echo "jaeger-stop: stopped pid $pid"
