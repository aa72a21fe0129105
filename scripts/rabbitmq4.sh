#!/usr/bin/env bash
# RabbitMQ 4.3 for sluice's tests, beside the machine's own RabbitMQ and never touching it.
#
# Debian sid packages rabbitmq-server 4.3 with the Erlang it needs; this script makes a sid
# chroot with it once (debootstrap --variant=minbase, about 2 minutes and 400 MB), keeps it
# in a cache folder git ignores, and runs 4.3 nodes from it: each with its own name, AMQP
# port, distribution port (AMQP port + 20000), management port (AMQP port + 10000, when the
# plugin is enabled), data and logs, every listener on 127.0.0.1, and an Erlang port mapper
# of its own (port 4371), so the host's nodes and their epmd (4369) are never involved.
# Deprecated features are denied, as 4.3 does by default.
#
#   scripts/rabbitmq4.sh ensure               make the chroot unless it is there (root, apt)
#   scripts/rabbitmq4.sh start NAME PORT [PLUGINS]
#                                             start node NAME on 127.0.0.1:PORT (running: no-op);
#                                             PLUGINS is a comma-separated list, default
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
#   scripts/rabbitmq4.sh version              print the chroot's RabbitMQ version
#
# Environment:
#   SLUICE_RABBITMQ4_CACHE  the cache folder (default <repo>/.cache/rabbitmq4); the chroot is
#                           its root/ and node data its root/var/lib/sluice/NAME
#   SLUICE_RABBITMQ4_MIRROR the Debian mirror debootstrap uses (default: debootstrap's own)
#   SLUICE_RABBITMQ4_EPMD   the Erlang port mapper's port inside the chroot (default 4371)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${SLUICE_RABBITMQ4_CACHE:-$repo/.cache/rabbitmq4}"
root="$cache/root"
epmd="${SLUICE_RABBITMQ4_EPMD:-4371}"
host="$(hostname -s 2>/dev/null || echo localhost)"
default_plugins="rabbitmq_management,rabbitmq_consistent_hash_exchange"

say() { echo "rabbitmq4: $*"; }
die() {
	echo "rabbitmq4: $*" >&2
	exit 1
}

installed() { [ -x "$root/usr/lib/rabbitmq/bin/rabbitmq-server" ]; }

need_root() {
	[ "$(id -u)" = 0 ] || die "$1 needs root (chroot, mounts); run as root, or start RabbitMQ 4.3 yourself and set AMQP_URL"
}

ensure() {
	if installed; then
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
	say "making a Debian sid chroot with rabbitmq-server in $root (once; about 2 minutes)"
	local begin=$SECONDS
	# shellcheck disable=SC2086 # the mirror is one word or nothing
	if ! debootstrap --variant=minbase --include=rabbitmq-server sid "$partial" ${SLUICE_RABBITMQ4_MIRROR:-} >"$cache/debootstrap.log" 2>&1; then
		tail -20 "$cache/debootstrap.log" >&2
		die "debootstrap failed (log: $cache/debootstrap.log)"
	fi
	mv "$partial" "$root"
	say "chroot ready in $((SECONDS - begin)) s: RabbitMQ $(version)"
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
		hosts
		mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
		for d in dev sys; do
			mountpoint -q "$root/$d" || mount --bind "/$d" "$root/$d"
		done
	) 8>"$cache/.mount.lock"
}

# inside_pids lists the processes whose root is the chroot.
inside_pids() {
	local real p
	real="$(readlink -f "$root")"
	for p in /proc/[0-9]*; do
		[ "$(readlink "$p/root" 2>/dev/null)" = "$real" ] && echo "${p#/proc/}"
	done
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
		say "node $name@$host already running on 127.0.0.1:$port"
		return
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
	local uid gid
	uid=$(awk -F: '$1=="rabbitmq"{print $3}' "$root/etc/passwd")
	gid=$(awk -F: '$1=="rabbitmq"{print $4}' "$root/etc/passwd")
	chown -R "$uid:$gid" "$root/var/lib/sluice"
	node_env "$name" "$port"
	local begin=$SECONDS
	("$0" run rabbitmq-server -detached) >/dev/null 2>&1 || true
	if ! "$0" run rabbitmqctl -n "$name@$host" wait "/var/lib/sluice/$name/node.pid" --timeout 120 >/dev/null 2>&1; then
		tail -30 "$dir/log/$name@$host.log" >&2 2>/dev/null || true
		die "node $name@$host did not boot (log: $dir/log)"
	fi
	say "node $name@$host (RabbitMQ $(version)) on 127.0.0.1:$port in $((SECONDS - begin)) s"
}

stop() {
	local name=${1:?stop NAME}
	installed || return 0
	if beams | grep -qx "$name@$host"; then
		"$0" ctl "$name" stop >/dev/null 2>&1 || true
		local i
		for i in $(seq 1 300); do
			beams | grep -qx "$name@$host" || break
			sleep 0.1
		done
		if beams | grep -qx "$name@$host"; then
			local pid
			for pid in $(inside_pids); do
				tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qx "$name@$host" && kill -9 "$pid" 2>/dev/null || true
			done
		fi
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
version) version ;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 2
	;;
esac
