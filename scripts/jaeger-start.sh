#!/usr/bin/env bash
# Starts a local Jaeger v2 (in-memory storage, every listener on 127.0.0.1) for development
# and tests, built from the version pinned in tools/jaeger/go.mod into this checkout's
# .cache/bin. Idempotent: if our Jaeger is already running and healthy it does nothing.
#
#   scripts/jaeger-start.sh          # build if needed, start, wait until healthy
#   scripts/jaeger-stop.sh           # stop it again
#
# Its ports are tools/jaeger/config.yaml's defaults (OTLP 4317/4318, UI and query API 16686).
# When another Jaeger (another checkout's, a container) already answers there, it is used
# and not claimed (jaeger-stop leaves it alone), unless JAEGER_OWN=1 (make test): then this
# checkout's Jaeger starts with every port moved by the same step of 100 to free ones. The
# ports in use are written to .cache/jaeger.env (JAEGER_QUERY_URL, OTLP endpoint), which
# make test reads.
#
# Environment:
#   JAEGER_START_TIMEOUT  seconds to wait for health (default 60)
#   JAEGER_REBUILD=1      rebuild the binary even if it is up to date
#   JAEGER_OWN=1          never use a Jaeger this script did not start (see above)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
. "$root/scripts/lib.sh"
cache="$root/.cache"
bin="$cache/bin/jaeger"
pidfile="$cache/jaeger.pid"
envfile="$cache/jaeger.env"
logfile="$cache/jaeger.log"
config="$root/tools/jaeger/config.yaml"
timeout="${JAEGER_START_TIMEOUT:-60}"

# The listeners, each with its default port (tools/jaeger/config.yaml) and its variable.
names=(OTLP_GRPC OTLP_HTTP QUERY QUERY_GRPC HEALTH METRICS)
declare -A default=([OTLP_GRPC]=4317 [OTLP_HTTP]=4318 [QUERY]=16686 [QUERY_GRPC]=16685 [HEALTH]=13133 [METRICS]=8888)
declare -A port
for n in "${names[@]}"; do port[$n]=${default[$n]}; done
# A running Jaeger of ours keeps the ports it was started with.
if [ -f "$envfile" ]; then
	for n in "${names[@]}"; do
		v=$(sed -n "s/^SLUICE_JAEGER_${n}_PORT=//p" "$envfile")
		[ -n "$v" ] && port[$n]=$v
	done
fi

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
	curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:${port[HEALTH]}/status" 2>/dev/null &&
		curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:${port[QUERY]}/api/services" 2>/dev/null
}

write_env() {
	{
		for n in "${names[@]}"; do echo "SLUICE_JAEGER_${n}_PORT=${port[$n]}"; done
		echo "JAEGER_QUERY_URL=http://127.0.0.1:${port[QUERY]}"
		echo "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:${port[OTLP_HTTP]}"
	} >"$envfile"
}

command -v curl >/dev/null || {
	echo "jaeger-start: curl is required (Debian: apt-get install curl; make test installs it)" >&2
	exit 1
}

if [ -f "$pidfile" ]; then
	pid="$(cat "$pidfile")"
	if is_ours "$pid"; then
		if healthy; then
			echo "jaeger-start: already running (pid $pid), UI/API http://127.0.0.1:${port[QUERY]}"
			exit 0
		fi
		echo "jaeger-start: pid $pid is running but not healthy; waiting" >&2
	else
		echo "jaeger-start: removing stale pid file (pid $pid is not our jaeger)" >&2
		rm -f "$pidfile"
	fi
fi

if [ ! -f "$pidfile" ]; then
	for n in "${names[@]}"; do port[$n]=${default[$n]}; done
	if healthy && [ "${JAEGER_OWN:-0}" != 1 ]; then
		# Something else (another checkout, a container) already serves these ports; starting
		# ours would only fail to bind. Use it, but do not claim it: jaeger-stop leaves it alone.
		write_env
		echo "jaeger-start: a Jaeger not started by this script already answers on 127.0.0.1:${port[QUERY]}; using it"
		exit 0
	fi
	# Ports of our own: the defaults, or all of them moved by the first free step of 100.
	step=0
	while :; do
		busy=""
		for n in "${names[@]}"; do
			port_open $((default[$n] + step)) && busy="$busy $((default[$n] + step))"
		done
		[ -z "$busy" ] && break
		[ $step = 0 ] && echo "jaeger-start: the default ports are taken (${busy# }); looking for free ones"
		step=$((step + 100))
		[ $step -le 2000 ] || {
			echo "jaeger-start: no free set of ports found (tried the defaults + 0..2000)" >&2
			exit 1
		}
	done
	for n in "${names[@]}"; do port[$n]=$((default[$n] + step)); done

	# go build is incremental, but linking a binary this size still takes seconds: skip it
	# when the binary is newer than the pinned versions.
	if [ "${JAEGER_REBUILD:-0}" = 1 ] || [ ! -x "$bin" ] ||
		[ "$root/tools/jaeger/go.mod" -nt "$bin" ] || [ "$root/tools/jaeger/go.sum" -nt "$bin" ]; then
		echo "jaeger-start: building jaeger (the first build downloads its modules, about 300 MB, and compiles for several minutes)"
		start_build=$(date +%s)
		(cd "$root/tools/jaeger" && go build -o "$bin" github.com/jaegertracing/jaeger/cmd/jaeger)
		echo "jaeger-start: built $bin in $(($(date +%s) - start_build))s"
	fi

	# setsid detaches Jaeger from the caller's process group, so a Ctrl-C in the terminal
	# that ran make does not kill it; it lives until jaeger-stop.
	launcher=()
	command -v setsid >/dev/null && launcher=(setsid)
	write_env
	cd "$cache"
	set -a
	# shellcheck disable=SC1090
	. "$envfile"
	set +a
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
		echo "jaeger-start: jaeger (pid $pid) not healthy after ${timeout}s (ports ${port[HEALTH]}, ${port[QUERY]}); see $logfile" >&2
		exit 1
	fi
	sleep 0.5
done
echo "jaeger-start: healthy; OTLP http://127.0.0.1:${port[OTLP_HTTP]} grpc 127.0.0.1:${port[OTLP_GRPC]}, UI/API http://127.0.0.1:${port[QUERY]}"
