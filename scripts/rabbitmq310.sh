#!/usr/bin/env bash
# RabbitMQ 3.10 for sluice's tests: nodes of this checkout's own, run from the machine's
# rabbitmq-server (Debian 12's package is 3.10), beside the machine's own node and never
# touching it: the system service is neither started, stopped nor configured. Each node has
# its own name, AMQP port, management port (AMQP port + 10000, when the plugin is enabled),
# distribution port (AMQP port + 20000), data and logs under .cache/rabbitmq310/NAME, every
# listener on 127.0.0.1; the nodes share an Erlang cookie in .cache/rabbitmq310/home and an
# Erlang port mapper of their own (4372, or the next free port), which the last node's stop
# ends, so the machine's nodes and their epmd (4369) are never involved.
#
#   scripts/rabbitmq310.sh start NAME PORT [PLUGINS]
#                                   start node NAME on 127.0.0.1:PORT ("auto": 5690, or the
#                                   next port whose three are free) and print its version;
#                                   PLUGINS is a comma-separated list, default
#                                   rabbitmq_management,rabbitmq_consistent_hash_exchange
#                                   ("none" for none)
#   scripts/rabbitmq310.sh stop NAME      stop it and remove its data
#   scripts/rabbitmq310.sh status         the running nodes
#   scripts/rabbitmq310.sh port NAME      the AMQP port of a running node
#   scripts/rabbitmq310.sh ctl NAME ARGS… rabbitmqctl -n NAME@HOST ARGS…
#   scripts/rabbitmq310.sh run ARGS…      run a RabbitMQ program (rabbitmq-server,
#                                         rabbitmqctl, …) as the nodes' user, with their
#                                         cookie and port mapper (for internal/testkit/testenv)
#   scripts/rabbitmq310.sh version        the machine's rabbitmq-server version
#   scripts/rabbitmq310.sh env NAME       the variables go test needs to use node NAME:
#                                         eval "$(scripts/rabbitmq310.sh env sluice310)"
#
# Run as root, the nodes run as the rabbitmq user (the package's), which owns their folders;
# run as another user, as that user.
#
# Environment:
#   SLUICE_RABBITMQ310_DIR  the folder (default <repo>/.cache/rabbitmq310, or one under /tmp
#                           when the rabbitmq user cannot reach the checkout)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
. "$repo/scripts/lib.sh"
host="$(hostname -s 2>/dev/null || echo localhost)"
default_plugins="rabbitmq_management,rabbitmq_consistent_hash_exchange"
bindir=/usr/lib/rabbitmq/bin

say() { echo "rabbitmq310: $*"; }
die() {
	echo "rabbitmq310: $*" >&2
	exit 1
}

if [ "$(id -u)" = 0 ]; then
	user=rabbitmq
else
	user="$(id -un)"
fi
dir="${SLUICE_RABBITMQ310_DIR:-$repo/.cache/rabbitmq310}"
# (Once a node ran from the checkout's own folder, the check is moot: run and ctl, which
# tests call often, skip it.)
if [ -z "${SLUICE_RABBITMQ310_DIR:-}" ] && [ ! -d "$dir/home" ] && [ "$(id -u)" = 0 ] && id rabbitmq >/dev/null 2>&1 &&
	! runuser -u rabbitmq -- test -x "$repo" 2>/dev/null; then
	dir="/tmp/sluice-rabbitmq310-$(printf '%s' "$repo" | md5sum | cut -c1-12)"
fi
home="$dir/home"

installed() { [ -x "$bindir/rabbitmq-server" ]; }

need_installed() {
	installed || die "no rabbitmq-server on this machine ($bindir): install Debian 12's rabbitmq-server package (3.10), or start RabbitMQ 3.10 yourself and set AMQP_URL"
	if [ "$(id -u)" = 0 ]; then
		id rabbitmq >/dev/null 2>&1 || die "running as root, but there is no rabbitmq user to run the node as"
	fi
}

version() {
	local d
	d=$(ls -d /usr/lib/rabbitmq/lib/rabbitmq_server-* 2>/dev/null | sort -V | tail -1)
	[ -n "$d" ] || die "no RabbitMQ installed in /usr/lib/rabbitmq"
	echo "${d##*rabbitmq_server-}"
}

epmd_port() { cat "$dir/epmd.port" 2>/dev/null || echo 4372; }

# as_user CMD…: CMD as the nodes' user, with only the environment a node needs: the
# caller's RABBITMQ_* and ERL_* variables (a node's own), the cookie's home and the port
# mapper. The machine's /etc/rabbitmq/rabbitmq-env.conf (the shared node's) never applies:
# every node has a RABBITMQ_CONF_ENV_FILE of its own.
as_user() {
	local -a pass=()
	while IFS= read -r kv; do
		case "$kv" in ERL_EPMD_PORT=* | ERL_EPMD_ADDRESS=*) continue ;; esac
		pass+=("$kv")
	done < <(env | grep -E '^(RABBITMQ|ERL)_[A-Z0-9_]*=' || true)
	local -a vars=(HOME="$home" PATH="$bindir:/usr/bin:/bin" LANG=C.UTF-8 LC_ALL=C.UTF-8
		ERL_EPMD_PORT="$(epmd_port)" ERL_EPMD_ADDRESS=127.0.0.1 "${pass[@]}")
	if [ "$(id -u)" = 0 ]; then
		(cd "$dir" && exec runuser -u "$user" -- env -i "${vars[@]}" "$@" 9>&-)
	else
		(cd "$dir" && exec env -i "${vars[@]}" "$@" 9>&-)
	fi
}

run() {
	need_installed
	[ -d "$home" ] || die "no node was started here yet ($dir)"
	local prog=$1
	shift
	[ -x "$bindir/$prog" ] && prog="$bindir/$prog"
	as_user "$prog" "$@"
}

# beams: the running nodes (NAME@HOST) of this folder, from its port mapper.
beams() {
	[ -f "$dir/epmd.pid" ] || return 0
	(as_user epmd -port "$(epmd_port)" -names 2>/dev/null || true) | awk -v h="$host" '$1=="name" && $2!~/^rabbitmqcli/ {print $2 "@" h}'
}

# ours_epmd: the recorded pid is alive and is an epmd.
ours_epmd() {
	local pid
	pid=$(cat "$dir/epmd.pid" 2>/dev/null) || return 1
	[ -n "$pid" ] && grep -q '^epmd' "/proc/$pid/comm" 2>/dev/null
}

# prepare: the folder, the cookie, and the port mapper, started here once.
prepare() {
	mkdir -p "$home"
	[ -f "$dir/.gitignore" ] || printf '*\n' >"$dir/.gitignore"
	if [ ! -s "$home/.erlang.cookie" ]; then
		head -c 120 /dev/urandom | base64 | tr -dc 'A-Z' | head -c 20 >"$home/.erlang.cookie"
		chmod 400 "$home/.erlang.cookie"
	fi
	[ "$(id -u)" = 0 ] && chown -R "$user:" "$home"
	if [ "$(id -u)" = 0 ]; then
		runuser -u "$user" -- test -w "$home" || die "the $user user cannot write $home (a parent folder is not searchable by it?); set SLUICE_RABBITMQ310_DIR"
	fi
	ours_epmd && return 0
	local p=4372
	while port_open "$p"; do p=$((p + 1)); done
	echo "$p" >"$dir/epmd.port"
	as_user epmd -daemon -port "$p" -address 127.0.0.1 || die "could not start an Erlang port mapper on 127.0.0.1:$p"
	local i pid=""
	for i in $(seq 1 50); do
		pid=$(epmd_pid "$p")
		[ -n "$pid" ] && port_open "$p" && break
		sleep 0.1
	done
	[ -n "$pid" ] || die "the Erlang port mapper did not listen on 127.0.0.1:$p"
	echo "$pid" >"$dir/epmd.pid"
}

# epmd_pid PORT: the epmd started with -port PORT.
epmd_pid() {
	local f
	for f in /proc/[0-9]*; do
		grep -q '^epmd' "$f/comm" 2>/dev/null || continue
		tr '\0' ' ' <"$f/cmdline" 2>/dev/null | grep -q -- "-port $1 " && {
			echo "${f#/proc/}"
			return 0
		}
	done
	return 0
}

# release: the port mapper goes when no node of this folder runs any more.
release() {
	ours_epmd || return 0
	[ -z "$(beams)" ] || return 0
	kill "$(cat "$dir/epmd.pid")" 2>/dev/null || true
	rm -f "$dir/epmd.pid"
}

node_env() {
	local name=$1 port=$2 d=$dir/$1
	export RABBITMQ_NODENAME="$name@$host" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="$port"
	export RABBITMQ_DIST_PORT=$((port + 20000)) RABBITMQ_MNESIA_BASE="$d/mnesia" RABBITMQ_LOG_BASE="$d/log"
	export RABBITMQ_PID_FILE="$d/node.pid" RABBITMQ_CONFIG_FILE="$d/rabbitmq.conf"
	export RABBITMQ_ADVANCED_CONFIG_FILE="$d/advanced.config" RABBITMQ_CONF_ENV_FILE="$d/rabbitmq-env.conf"
	export RABBITMQ_ENABLED_PLUGINS_FILE="$d/enabled_plugins"
	export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

start() {
	local name=${1:?start NAME PORT [PLUGINS]} port=${2:?start NAME PORT [PLUGINS]} plugins=${3:-$default_plugins}
	need_installed
	local v
	v="$(version)"
	mkdir -p "$(dirname "$dir")"
	exec 9>"$dir.lock"
	flock 9
	if alive "$(cat "$dir/$name/node.pid" 2>/dev/null)" || beams | grep -qx "$name@$host"; then
		say "node $name@$host is still running from an earlier start; stopping it first"
		stop_locked "$name"
	fi
	if [ "$port" = auto ]; then
		port="$(free_node_port 5690 5699)" || die "no free port for a node between 5690 and 5699 (each needs PORT, PORT+10000 and PORT+20000)"
	fi
	local busy
	busy="$(node_ports_busy "$port")"
	[ -z "$busy" ] || die "node $name@$host cannot start on 127.0.0.1:$port: $busy"
	prepare
	local d="$dir/$name"
	rm -rf "$d"
	mkdir -p "$d/mnesia" "$d/log"
	[ "$plugins" = none ] && plugins=""
	{
		echo "listeners.tcp.1 = 127.0.0.1:$port"
		echo "loopback_users.guest = true"
		echo "log.console = false"
		echo "log.file.level = info"
		if [[ ",$plugins," == *",rabbitmq_management,"* ]]; then
			echo "management.tcp.ip = 127.0.0.1"
			echo "management.tcp.port = $((port + 10000))"
		fi
	} >"$d/rabbitmq.conf"
	: >"$d/rabbitmq-env.conf"
	echo "[]." >"$d/advanced.config"
	echo "[${plugins}]." >"$d/enabled_plugins"
	echo "$port" >"$d/port"
	[ "$(id -u)" = 0 ] && chown -R "$user:" "$d"
	node_env "$name" "$port"
	local begin=$SECONDS
	if ! as_user "$bindir/rabbitmq-server" -detached >"$d/log/startup.log" 2>&1; then
		cat "$d/log/startup.log" >&2
		die "rabbitmq-server for $name@$host failed to launch (output above)"
	fi
	if ! await_boot "$d/log/$name@$host.log" 0 "$d/node.pid" 120; then
		explain_boot_failure "$name" "$d" "$port"
		die "node $name@$host did not boot (folder: $d/log)"
	fi
	say "started RabbitMQ $(logged_version "$d/log") node $name@$host on 127.0.0.1:$port in $((SECONDS - begin)) s (the machine's rabbitmq-server $v)"
}

# explain_boot_failure NAME DIR PORT: why a node did not boot, as far as can be told.
explain_boot_failure() {
	local name=$1 d=$2 port=$3 logf="$2/log/$1@$host.log"
	echo "rabbitmq310: node $name@$host did not boot; what it said:" >&2
	if [ -s "$logf" ]; then
		grep -iE 'error|eaddrinuse|failed|crash' "$logf" | tail -15 >&2 || tail -15 "$logf" >&2
	else
		echo "  (its log $logf is empty: it stopped before logging)" >&2
	fi
	tail -15 "$d/log/startup.log" >&2 2>/dev/null || true
	local busy
	busy="$(node_ports_busy "$port")"
	[ -n "$busy" ] && echo "rabbitmq310: $busy" >&2
	return 0
}

stop_locked() {
	local name=$1 d=$dir/$1
	if alive "$(cat "$d/node.pid" 2>/dev/null)"; then
		stop_node_pid "$d/node.pid"
		say "node $name@$host stopped"
	elif beams | grep -qx "$name@$host"; then
		as_user "$bindir/rabbitmqctl" -n "$name@$host" stop >/dev/null 2>&1 || true
		say "node $name@$host stopped"
	fi
	rm -rf "$d"
	release
}

stop() {
	local name=${1:?stop NAME}
	[ -d "$dir" ] || return 0
	exec 9>"$dir.lock"
	flock 9
	stop_locked "$name"
}

case "${1:-}" in
start)
	shift
	start "$@"
	;;
stop)
	shift
	stop "$@"
	;;
status)
	installed || {
		say "no rabbitmq-server on this machine"
		exit 0
	}
	say "RabbitMQ $(version) (the machine's rabbitmq-server), nodes in $dir"
	beams | sed 's/^/running: /'
	;;
port) cat "$dir/${2:?port NAME}/port" ;;
ctl)
	name=${2:?ctl NAME ARGS...}
	shift 2
	run rabbitmqctl -n "$name@$host" "$@"
	;;
run)
	shift
	run "$@"
	;;
version) version ;;
env)
	[ -n "${2:-}" ] || die "env NAME"
	[ -s "$dir/$2/port" ] || die "no node $2 was started here"
	echo "export AMQP_URL=amqp://guest:guest@127.0.0.1:$(cat "$dir/$2/port")/ SLUICE_RABBITMQ=3.10 SLUICE_RABBITMQ_NODE=$2@$host"
	echo "export SLUICE_RABBITMQ_RUN='$repo/scripts/rabbitmq310.sh run'"
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 2
	;;
esac
