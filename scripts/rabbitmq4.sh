#!/usr/bin/env bash
# RabbitMQ 4.3 for sluice's tests, beside the machine's own RabbitMQ and never touching it.
#
# Debian sid packages rabbitmq-server 4.3 with the Erlang it needs; this script makes a sid
# chroot with it once (debootstrap --variant=minbase, about 2 minutes and 400 MB), keeps it
# in a cache folder git ignores, and runs 4.3 nodes from it: each with its own name, AMQP
# port, distribution port (AMQP port + 20000), management port (AMQP port + 10000, when the
# plugin is enabled), data and logs, every listener on 127.0.0.1, and an Erlang port mapper
# of its own (port 4371, or the next free one when another chroot's holds it), so the host's
# nodes and their epmd (4369) are never involved. Deprecated features are denied, as 4.3
# does by default.
#
# The suite is written for RabbitMQ 4.3.x: the chroot's version is checked when it is made
# and at every start, and a chroot of another series is refused, naming its version (the day
# Debian sid moves past 4.3, a new chroot says so; one made before keeps working).
#
#   scripts/rabbitmq4.sh ensure               make the chroot unless it is there (root, apt)
#   scripts/rabbitmq4.sh start NAME PORT [PLUGINS]
#                                             start node NAME on 127.0.0.1:PORT (running: no-op;
#                                             "auto": 5673, or the next port whose AMQP,
#                                             management and distribution ports are free) and
#                                             print its version; PLUGINS is a comma-separated list, default
#                                             rabbitmq_management,rabbitmq_consistent_hash_exchange
#                                             ("none" for none)
#   scripts/rabbitmq4.sh stop NAME            stop it (its data stays for the next start)
#   scripts/rabbitmq4.sh reset NAME           stop it and remove its data
#   scripts/rabbitmq4.sh status               the running nodes
#   scripts/rabbitmq4.sh ctl NAME ARGS...     rabbitmqctl -n NAME@HOST ARGS... inside the chroot
#   scripts/rabbitmq4.sh plugins NAME ARGS... rabbitmq-plugins -n NAME@HOST ARGS...
#   scripts/rabbitmq4.sh run ARGS...          run ARGS inside the chroot as the rabbitmq user,
#                                             with the node environment (for internal/testkit/testenv)
#   scripts/rabbitmq4.sh mount | release      mount /proc, /dev, /sys into the chroot; undo it
#                                             when no process runs there any more
#   scripts/rabbitmq4.sh root                 print the chroot's path
#   scripts/rabbitmq4.sh port NAME            the AMQP port node NAME was last started on
#   scripts/rabbitmq4.sh version              print the chroot's RabbitMQ version
#   scripts/rabbitmq4.sh env NAME             the variables go test needs to use node NAME:
#                                             eval "$(scripts/rabbitmq4.sh env sluice43)"
#
# Environment:
#   SLUICE_RABBITMQ4_CACHE  the cache folder (default <repo>/.cache/rabbitmq4); the chroot is
#                           its root/ and node data its root/var/lib/sluice/NAME
#   SLUICE_RABBITMQ4_MIRROR the Debian mirror debootstrap uses (default: debootstrap's own)
#   SLUICE_RABBITMQ4_SUITE  the Debian suite the chroot is made from (default sid); another
#                           suite that ships rabbitmq-server 4.3 once sid has moved on
#   SLUICE_RABBITMQ4_EPMD   the Erlang port mapper's port inside the chroot (default: 4371,
#                           or the free port recorded in the cache folder's epmd.port)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
. "$repo/scripts/lib.sh"
cache="${SLUICE_RABBITMQ4_CACHE:-$repo/.cache/rabbitmq4}"
root="$cache/root"
suite="${SLUICE_RABBITMQ4_SUITE:-sid}"
want_series=4.3
epmd="${SLUICE_RABBITMQ4_EPMD:-$(cat "$cache/epmd.port" 2>/dev/null || echo 4371)}"
host="$(hostname -s 2>/dev/null || echo localhost)"
default_plugins="rabbitmq_management,rabbitmq_consistent_hash_exchange"

say() { echo "rabbitmq4: $*"; }
die() {
	echo "rabbitmq4: $*" >&2
	exit 1
}

installed() { [ -x "$root/usr/lib/rabbitmq/bin/rabbitmq-server" ]; }

need_root() {
	[ "$(id -u)" = 0 ] || die "$1 needs root (chroot, mounts; running as $(id -un)); run as root, or start RabbitMQ 4.3 yourself and set AMQP_URL"
}

# check_series: the chroot's RabbitMQ is of the series the suite is written for.
check_series() {
	local v
	v="$(version)"
	[ "$(series "$v")" = "$want_series" ] ||
		die "the chroot in $root has RabbitMQ $v, not $want_series.x, the version the 4.3 part is written for and labelled with; remove $root to make it again (SLUICE_RABBITMQ4_SUITE: a Debian suite that ships $want_series)"
}

ensure() {
	if installed; then
		check_series
		return
	fi
	need_root "making the RabbitMQ 4.3 chroot"
	if ! command -v debootstrap >/dev/null 2>&1; then
		command -v apt-get >/dev/null 2>&1 || die "debootstrap is missing and there is no apt-get to install it"
		say "installing debootstrap"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
			{ apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; } ||
			die "apt-get install debootstrap failed"
	fi
	mkdir -p "$cache"
	local partial="$cache/root.partial"
	rm -rf "$partial"
	say "making a Debian $suite chroot with rabbitmq-server in $root (once; about 2 minutes and 400 MB downloaded from Debian's mirror)"
	local begin=$SECONDS
	# shellcheck disable=SC2086 # the mirror is one word or nothing
	if ! debootstrap --variant=minbase --include=rabbitmq-server "$suite" "$partial" ${SLUICE_RABBITMQ4_MIRROR:-} >"$cache/debootstrap.log" 2>&1; then
		tail -20 "$cache/debootstrap.log" >&2
		die "debootstrap of Debian $suite failed (is Debian's mirror reachable? log: $cache/debootstrap.log)"
	fi
	local got dir
	dir=$(ls -d "$partial"/usr/lib/rabbitmq/lib/rabbitmq_server-* 2>/dev/null | head -1)
	got="${dir##*rabbitmq_server-}"
	if [ "$(series "$got")" != "$want_series" ]; then
		die "Debian $suite ships RabbitMQ ${got:-(none)}, not $want_series.x, the version the 4.3 part is written for; the chroot is left in $partial. Set SLUICE_RABBITMQ4_SUITE to a Debian suite that still ships $want_series, or reuse a cached chroot (SLUICE_RABBITMQ4_CACHE)"
	fi
	mv "$partial" "$root"
	say "chroot ready in $((SECONDS - begin)) s: RabbitMQ $(version) (Debian $suite)"
}

version() {
	local dir
	dir=$(ls -d "$root"/usr/lib/rabbitmq/lib/rabbitmq_server-* 2>/dev/null | head -1)
	[ -n "$dir" ] || die "no RabbitMQ in $root (run: $0 ensure)"
	echo "${dir##*rabbitmq_server-}"
}

# hosts gives the chroot a hosts file naming this machine, so NAME@HOST resolves inside.
hosts() {
	{
		# On 127.0.0.1, where the chroot's port mapper listens.
		echo "127.0.0.1 localhost $host"
		echo "::1 localhost ip6-localhost ip6-loopback"
	} >"$root/etc/hosts"
}

do_mount() {
	need_root "mounting into the chroot"
	installed || die "no chroot in $root (run: $0 ensure)"
	(
		# Nodes of a cluster start at once: one mounts, the others find it done.
		flock 8
		pick_epmd
		hosts
		mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
		for d in dev sys; do
			mountpoint -q "$root/$d" || mount --bind "/$d" "$root/$d"
		done
	) 8>"$cache/.mount.lock"
}

# pick_epmd: the chroot's port mapper port, recorded in the cache folder: 4371 unless
# something outside this chroot (another checkout's chroot) holds it, then the next free one.
pick_epmd() {
	[ -n "${SLUICE_RABBITMQ4_EPMD:-}" ] && return 0
	local pid
	for pid in $(inside_pids); do
		grep -q '^epmd' "/proc/$pid/comm" 2>/dev/null && return 0 # ours runs: keep its port
	done
	local p=4371
	while port_open "$p"; do p=$((p + 1)); done
	[ "$p" = "$epmd" ] || say "the Erlang port mapper of this chroot listens on 127.0.0.1:$p (4371 is taken)"
	echo "$p" >"$cache/epmd.port"
	epmd=$p
}

# inside_pids lists the processes whose root is the chroot.
inside_pids() {
	local real
	real="$(readlink -f "$root")"
	# One find, not a readlink per process: this runs at every node's start and stop.
	find /proc -mindepth 2 -maxdepth 2 -name root -lname "$real" 2>/dev/null | cut -d/ -f3
	return 0
}

# beams lists the running nodes (NAME@HOST), from the chroot's port mapper.
beams() {
	[ -n "$(inside_pids)" ] || return 0
	("$0" run epmd -names 2>/dev/null || true) | awk -v h="$host" '$1=="name" && $2!~/^rabbitmqcli/ {print $2 "@" h}'
}

release() {
	[ -d "$root/proc" ] || return 0
	exec 8>"$cache/.mount.lock"
	flock 8
	# Any Erlang VM left (a node, or one still booting, not yet known to the port mapper)
	# keeps the chroot mounted.
	local pid
	for pid in $(inside_pids); do
		grep -q beam "/proc/$pid/comm" 2>/dev/null && return 0
	done
	# No node left: the port mapper goes, then the mounts.
	for pid in $(inside_pids); do
		kill "$pid" 2>/dev/null || true
	done
	for d in sys dev proc; do
		if mountpoint -q "$root/$d"; then
			umount "$root/$d" 2>/dev/null || umount -l "$root/$d"
		fi
	done
}

run() {
	need_root "running inside the chroot"
	local uid gid
	uid=$(awk -F: '$1=="rabbitmq"{print $3}' "$root/etc/passwd")
	gid=$(awk -F: '$1=="rabbitmq"{print $4}' "$root/etc/passwd")
	[ -n "$uid" ] || die "no rabbitmq user in $root"
	# RABBITMQ_* and ERL_* variables of the caller pass through; nothing else of the host's
	# environment does.
	local -a pass=()
	while IFS= read -r kv; do
		# The chroot's port mapper, never a caller's (a 3.10 node's).
		case "$kv" in ERL_EPMD_PORT=* | ERL_EPMD_ADDRESS=*) continue ;; esac
		pass+=("$kv")
	done < <(env | grep -E '^(RABBITMQ|ERL)_[A-Z0-9_]*=' || true)
	exec chroot --userspec="$uid:$gid" "$root" /usr/bin/env -i HOME=/var/lib/rabbitmq \
		PATH=/usr/lib/rabbitmq/bin:/usr/bin:/bin LANG=C.UTF-8 LC_ALL=C.UTF-8 \
		ERL_EPMD_PORT="$epmd" ERL_EPMD_ADDRESS=127.0.0.1 "${pass[@]}" "$@"
}

node_env() {
	local name=$1 port=$2 dir=/var/lib/sluice/$1
	export RABBITMQ_NODENAME="$name@$host" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="$port"
	export RABBITMQ_DIST_PORT=$((port + 20000)) RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log"
	export RABBITMQ_PID_FILE="$dir/node.pid" RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf"
	export RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf"
	export RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins"
	export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

start() {
	local name=${1:?start NAME PORT [PLUGINS]} port=${2:?start NAME PORT [PLUGINS]} plugins=${3:-$default_plugins}
	ensure
	do_mount
	if beams | grep -qx "$name@$host"; then
		say "node $name@$host (RabbitMQ $(version)) already running on 127.0.0.1:$(cat "$root/var/lib/sluice/$name/port" 2>/dev/null || echo "$port")"
		return
	fi
	if [ "$port" = auto ]; then
		port="$(free_node_port 5673 5680)" || die "no free port for a node between 5673 and 5680 (each needs PORT, PORT+10000 and PORT+20000)"
	fi
	local busy
	busy="$(node_ports_busy "$port")"
	if [ -n "$busy" ]; then
		release
		die "node $name@$host cannot start on 127.0.0.1:$port: $busy"
	fi
	local dir="$root/var/lib/sluice/$name"
	mkdir -p "$dir/mnesia" "$dir/log"
	[ "$plugins" = none ] && plugins=""
	{
		echo "listeners.tcp.1 = 127.0.0.1:$port"
		echo "loopback_users = none"
		echo "log.console = false"
		echo "log.file.level = info"
		# 4.3's defaults, said out loud: a feature sluice relied on would fail here first.
		echo "deprecated_features.permit.transient_nonexcl_queues = false"
		echo "deprecated_features.permit.global_qos = false"
		if [[ ",$plugins," == *",rabbitmq_management,"* ]]; then
			echo "management.tcp.ip = 127.0.0.1"
			echo "management.tcp.port = $((port + 10000))"
		fi
	} >"$dir/rabbitmq.conf"
	: >"$dir/rabbitmq-env.conf"
	echo "[]." >"$dir/advanced.config"
	echo "[${plugins}]." >"$dir/enabled_plugins"
	echo "$port" >"$dir/port"
	local uid gid
	uid=$(awk -F: '$1=="rabbitmq"{print $3}' "$root/etc/passwd")
	gid=$(awk -F: '$1=="rabbitmq"{print $4}' "$root/etc/passwd")
	chown -R "$uid:$gid" "$root/var/lib/sluice"
	node_env "$name" "$port"
	local begin=$SECONDS offset=0
	rm -f "$dir/node.pid"
	[ -f "$dir/log/$name@$host.log" ] && offset=$(stat -c %s "$dir/log/$name@$host.log")
	("$0" run rabbitmq-server -detached) >"$dir/log/startup.log" 2>&1 || true
	if ! await_boot "$dir/log/$name@$host.log" "$offset" "$dir/node.pid" 120; then
		explain_boot_failure "$name" "$dir" "$port"
		release
		die "node $name@$host did not boot (its folder: $dir/log)"
	fi
	say "started RabbitMQ $(logged_version "$dir/log") node $name@$host on 127.0.0.1:$port in $((SECONDS - begin)) s (Debian chroot $root)"
}

# explain_boot_failure NAME DIR PORT: why a node did not boot, as far as can be told.
explain_boot_failure() {
	local name=$1 dir=$2 port=$3 logf="$2/log/$1@$host.log"
	echo "rabbitmq4: node $name@$host did not boot; what it said:" >&2
	if [ -s "$logf" ]; then
		grep -iE 'error|eaddrinuse|failed|crash' "$logf" | tail -15 >&2 || tail -15 "$logf" >&2
	else
		echo "  (its log $logf is empty: it stopped before logging)" >&2
	fi
	tail -15 "$dir/log/startup.log" >&2 2>/dev/null || true
	local busy
	busy="$(node_ports_busy "$port")"
	[ -n "$busy" ] && echo "rabbitmq4: $busy" >&2
	return 0
}

stop() {
	local name=${1:?stop NAME}
	installed || return 0
	local pidfile="$root/var/lib/sluice/$name/node.pid"
	if alive "$(cat "$pidfile" 2>/dev/null)"; then
		stop_node_pid "$pidfile"
		say "node $name@$host stopped"
	elif beams | grep -qx "$name@$host"; then
		# Running, but not the pid its file names (a start before that file was written).
		"$0" ctl "$name" stop >/dev/null 2>&1 || true
		say "node $name@$host stopped"
	fi
	release
}

case "${1:-}" in
ensure) ensure ;;
start)
	shift
	start "$@"
	;;
stop)
	shift
	stop "$@"
	;;
reset)
	stop "${2:?reset NAME}"
	rm -rf "${root:?}/var/lib/sluice/${2:?}"
	;;
status)
	installed || {
		say "no chroot in $root"
		exit 0
	}
	say "RabbitMQ $(version) in $root"
	beams | sed 's/^/running: /'
	;;
ctl)
	name=${2:?ctl NAME ARGS...}
	shift 2
	run rabbitmqctl -n "$name@$host" "$@"
	;;
plugins)
	name=${2:?plugins NAME ARGS...}
	shift 2
	node_env "$name" 0
	run rabbitmq-plugins -n "$name@$host" "$@"
	;;
run)
	shift
	run "$@"
	;;
mount) do_mount ;;
release) release ;;
root) echo "$root" ;;
port) cat "$root/var/lib/sluice/${2:?port NAME}/port" ;;
version) version ;;
env)
	[ -n "${2:-}" ] || die "env NAME"
	[ -s "$root/var/lib/sluice/$2/port" ] || die "no node $2 was started here"
	echo "export AMQP_URL=amqp://guest:guest@127.0.0.1:$(cat "$root/var/lib/sluice/$2/port")/ SLUICE_RABBITMQ=4.3 SLUICE_RABBITMQ_NODE=$2@$host"
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 2
	;;
esac
