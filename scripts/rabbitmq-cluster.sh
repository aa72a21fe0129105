#!/usr/bin/env bash
# A local three-node RabbitMQ cluster for sluice's cluster tests (test/cluster), started on
# this one machine beside the shared RabbitMQ node, which it never touches: its nodes have
# their own names (sluice-c1@HOST …), AMQP ports (5681-5683), distribution ports
# (25681-25683), config, plugins file and data, every listener on 127.0.0.1. The
# consistent-hash exchange plugin is enabled; management is not.
#
#   scripts/rabbitmq-cluster.sh start    start and cluster the nodes (already running: no-op)
#   scripts/rabbitmq-cluster.sh stop     stop exactly the nodes it started, remove its data
#   scripts/rabbitmq-cluster.sh status   each node's state and the cluster's members
#   scripts/rabbitmq-cluster.sh urls     the AMQP URLs, comma-separated (AMQP_URL form)
#   scripts/rabbitmq-cluster.sh ctl N …  rabbitmqctl -n <node N> … (N = 1..3), as the
#                                        right user with the right cookie
#
# start is idempotent: three running, clustered nodes are left alone. Anything else left
# by an earlier run (a killed test, a half-started cluster, stale data) is stopped and
# wiped first, so a start always ends with a fresh cluster or an error.
#
# Several test runs may share the cluster: each names itself with SLUICE_CLUSTER_USER (its
# pid) on start and stop, and stop then leaves the cluster running while another user's
# process is alive. start and stop hold a lock ($dir.lock), so concurrent ones take turns.
# Nodes are recognized by name and data directory: another checkout's nodes are never
# stopped (its ports are then in use, and start says so).
#
# Run as root, the nodes run as the rabbitmq user (the packaged scripts want that; its
# $HOME/.erlang.cookie is the cookie every node and rabbitmqctl share), and the data
# directory is owned by rabbitmq. Run as another user, they run as that user with its own
# cookie.
#
# Environment:
#   SLUICE_CLUSTER_DIR        data, logs, config (default: <repo>/.cache/cluster, or a
#                             directory under /tmp when the rabbitmq user cannot reach it)
#   SLUICE_CLUSTER_HOST       host part of the node names (default: hostname -s)
#   SLUICE_CLUSTER_AMQP_PORT  AMQP port of node 1; nodes 2, 3 use the next ones (5681)
#   SLUICE_CLUSTER_DIST_PORT  distribution port of node 1; likewise (25681)
#   SLUICE_CLUSTER_TIMEOUT    seconds to wait for a node to boot (default 90)
#   SLUICE_CLUSTER_USER       pid of the process using the cluster (see above)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
. "$root/scripts/lib.sh"
dir="${SLUICE_CLUSTER_DIR:-$root/.cache/cluster}"
# Run as root, the nodes run as rabbitmq, which must reach the data directory: a checkout
# under a private home (/root is 0700) gets one under /tmp instead, named after it.
if [ -z "${SLUICE_CLUSTER_DIR:-}" ] && [ "$(id -u)" = 0 ] && id rabbitmq >/dev/null 2>&1 &&
	! runuser -u rabbitmq -- test -x "$root" 2>/dev/null; then
	dir="/tmp/sluice-cluster-$(printf '%s' "$root" | md5sum | cut -c1-12)"
fi
host="${SLUICE_CLUSTER_HOST:-$(hostname -s)}"
amqp_base="${SLUICE_CLUSTER_AMQP_PORT:-5681}"
dist_base="${SLUICE_CLUSTER_DIST_PORT:-25681}"
timeout="${SLUICE_CLUSTER_TIMEOUT:-90}"
nodes=3
rmq_bin=/usr/lib/rabbitmq/bin
[ -x "$rmq_bin/rabbitmq-server" ] || rmq_bin="$(dirname "$(command -v rabbitmq-server 2>/dev/null || echo /nonexistent/x)")"

say() { echo "rabbitmq-cluster: $*"; }
die() {
	echo "rabbitmq-cluster: $*" >&2
	exit 1
}

# RabbitMQ 4.3 (SLUICE_RABBITMQ=4.3): the same three nodes, names and ports, run from
# scripts/rabbitmq4.sh's chroot (Khepri metadata, deprecated features denied).
if [ "${SLUICE_RABBITMQ:-}" = 4.3 ]; then
	r4="$root/scripts/rabbitmq4.sh"
	node43() { echo "sluice-c$1"; }
	case "${1:-}" in
	start)
		t0=$SECONDS
		for n in $(seq 1 $nodes); do
			"$r4" reset "$(node43 "$n")" >/dev/null
		done
		out43="$(mktemp -d)"
		pids43=()
		for n in $(seq 1 $nodes); do
			"$r4" start "$(node43 "$n")" $((amqp_base + n - 1)) rabbitmq_consistent_hash_exchange >"$out43/$n" 2>&1 &
			pids43+=($!)
		done
		failed=0
		for pid in "${pids43[@]}"; do wait "$pid" || failed=1; done
		# Each node's line names the version it booted (the run's output lists them).
		cat "$out43"/* 2>/dev/null
		rm -rf "$out43"
		[ $failed = 0 ] || die "a 4.3 node did not start (above)"
		# rabbitmq4.sh start returns once each node's log says its boot completed.
		for n in $(seq 2 $nodes); do
			out="$("$r4" ctl "$(node43 "$n")" -q stop_app 2>&1)" || die "stop_app on $(node43 "$n"): $out"
			out="$("$r4" ctl "$(node43 "$n")" -q join_cluster "$(node43 1)@$host" 2>&1)" || die "$(node43 "$n") could not join: $out"
			out="$("$r4" ctl "$(node43 "$n")" -q start_app 2>&1)" || die "start_app on $(node43 "$n"): $out"
		done
		say "RabbitMQ 4.3 cluster started in $((SECONDS - t0))s"
		;;
	stop)
		for n in $(seq 1 $nodes); do
			"$r4" reset "$(node43 "$n")" >/dev/null
		done
		say "stopped"
		;;
	status)
		for n in $(seq 1 $nodes); do
			"$r4" ctl "$(node43 "$n")" -q await_startup --timeout 2 >/dev/null 2>&1 &&
				echo "$(node43 "$n")@$host: running, amqp 127.0.0.1:$((amqp_base + n - 1))" || echo "$(node43 "$n")@$host: not running"
		done
		;;
	urls)
		out=()
		for n in $(seq 1 $nodes); do out+=("amqp://guest:guest@127.0.0.1:$((amqp_base + n - 1))/"); done
		(
			IFS=,
			echo "${out[*]}"
		)
		;;
	ctl)
		n="${2:?ctl needs a node number 1..$nodes}"
		shift 2
		"$r4" ctl "$(node43 "$n")" "$@"
		;;
	*) die "usage: $0 start|stop|status|urls|ctl N ARGS..." ;;
	esac
	exit
fi

node_name() { echo "sluice-c$1@$host"; }
amqp_port() { echo $((amqp_base + $1 - 1)); }
dist_port() { echo $((dist_base + $1 - 1)); }
pid_file() { echo "$dir/n$1/rabbit.pid"; }

# The user the nodes run as, and its home (where the Erlang cookie is).
if [ "$(id -u)" = 0 ]; then
	run_user=rabbitmq
	id "$run_user" >/dev/null 2>&1 || die "running as root, but there is no rabbitmq user to run the nodes as"
	run_home="$(getent passwd "$run_user" | cut -d: -f6)"
else
	run_user="$(id -un)"
	run_home="$HOME"
fi

# as_user CMD…: run CMD as the nodes' user with a clean, explicit environment, so nothing
# from the caller (nor /etc/rabbitmq/rabbitmq-env.conf, which belongs to the shared node)
# leaks into our nodes. $1 is the node number whose variables to set (0: none).
as_user() {
	local n="$1"
	shift
	local -a vars=(
		"HOME=$run_home"
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin"
		"LANG=C.UTF-8"
		"LC_ALL=C.UTF-8"
		"ERL_EPMD_ADDRESS=127.0.0.1"
		"RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf"
		"RABBITMQ_CTL_DIST_PORT_MIN=$((dist_base + 10010))"
		"RABBITMQ_CTL_DIST_PORT_MAX=$((dist_base + 10040))"
	)
	if [ "$n" != 0 ]; then
		vars+=(
			"RABBITMQ_NODENAME=$(node_name "$n")"
			"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1"
			"RABBITMQ_NODE_PORT=$(amqp_port "$n")"
			"RABBITMQ_DIST_PORT=$(dist_port "$n")"
			"RABBITMQ_CONFIG_FILE=$dir/n$n/rabbitmq.conf"
			"RABBITMQ_ADVANCED_CONFIG_FILE=$dir/n$n/advanced.config"
			"RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins"
			"RABBITMQ_MNESIA_BASE=$dir/n$n/mnesia"
			"RABBITMQ_LOG_BASE=$dir/n$n/log"
			"RABBITMQ_PID_FILE=$(pid_file "$n")"
			"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}"
		)
	fi
	# 9>&-: the lock's descriptor must not live on in a node, which would hold the lock.
	if [ "$(id -u)" = 0 ]; then
		(cd "$dir" 2>/dev/null || cd /; runuser -u "$run_user" -- env -i "${vars[@]}" "$@" 9>&-)
	else
		(cd "$dir" 2>/dev/null || cd /; env -i "${vars[@]}" "$@" 9>&-)
	fi
}

ctl() {
	local n="$1"
	shift
	as_user 0 "$rmq_bin/rabbitmqctl" -n "$(node_name "$n")" "$@"
}

# ours PID N: PID is alive and is the Erlang VM of our node N (the VM's command line does
# not name the node; its environment does).
ours() {
	local pid="$1" n="$2"
	case "$pid" in '' | *[!0-9]*) return 1 ;; esac
	kill -0 "$pid" 2>/dev/null || return 1
	local env
	env="$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ")" || return 1
	echo "$env" | grep -qx "RABBITMQ_NODENAME=$(node_name "$n")" &&
		echo "$env" | grep -qx "RABBITMQ_MNESIA_BASE=$dir/n$n/mnesia"
}

# node_pids N: pids of our node N's VM: the pid file's, and any VM whose environment names
# our node (a run killed before the pid file was written).
node_pids() {
	local n="$1" pid
	{
		# The node writes its pid file without a newline.
		if [ -f "$(pid_file "$n")" ]; then echo "$(cat "$(pid_file "$n")" 2>/dev/null)"; fi
		pgrep -u "$run_user" beam.smp 2>/dev/null || true
	} | sort -u | while read -r pid; do
		if ours "$pid" "$n"; then echo "$pid"; fi
	done
}

running() { ctl "$1" -q await_startup --timeout 2 >/dev/null 2>&1; }

# running_members: the members node 1 sees running, one per line.
running_members() {
	ctl 1 -q cluster_status --formatter json 2>/dev/null | tr -d ' \n' |
		grep -o '"running_nodes":\[[^]]*\]' | grep -o '"[^"]*@[^"]*"' | tr -d '"'
}

clustered() {
	local members n
	members="$(running_members)" || return 1
	for n in $(seq 1 $nodes); do
		echo "$members" | grep -qx "$(node_name "$n")" || return 1
	done
}

stop_node() {
	local n="$1" pid waited
	if running "$n"; then
		# stop with the pid file waits for the VM to exit.
		ctl "$n" -q stop "$(pid_file "$n")" >/dev/null 2>&1 || true
	fi
	for pid in $(node_pids "$n"); do
		kill -TERM "$pid" 2>/dev/null || true
		waited=0
		while ours "$pid" "$n" && [ $waited -lt 100 ]; do
			sleep 0.1
			waited=$((waited + 1))
		done
		ours "$pid" "$n" && kill -KILL "$pid" 2>/dev/null || true
	done
}

stop_all() {
	local n
	for n in $(seq 1 $nodes); do stop_node "$n" & done
	wait
	# Only what start created: the directory is ours (it holds our marker).
	if [ -d "$dir" ]; then
		[ -f "$dir/.sluice-cluster" ] || die "$dir exists but was not made by this script; not removing it"
		rm -rf "$dir"
	fi
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

write_files() {
	local n
	mkdir -p "$dir"
	touch "$dir/.sluice-cluster"
	# The test data is never to be committed, whatever the repository's .gitignore says.
	printf '*\n' >"$dir/.gitignore"
	: >"$dir/rabbitmq-env.conf"
	echo '[rabbitmq_consistent_hash_exchange].' >"$dir/enabled_plugins"
	for n in $(seq 1 $nodes); do
		mkdir -p "$dir/n$n/mnesia" "$dir/n$n/log"
		cat >"$dir/n$n/rabbitmq.conf" <<-EOF
			listeners.tcp.1 = 127.0.0.1:$(amqp_port "$n")
			loopback_users.guest = true
			log.file.level = info
			log.console = false
		EOF
		# Quorum queues get a replica on each of the three nodes (3.10's default is 3 too,
		# but rabbitmq.conf has no key for it; x-quorum-initial-group-size overrides it).
		echo "[{rabbit, [{quorum_cluster_size, $nodes}]}]." >"$dir/n$n/advanced.config"
	done
	if [ "$(id -u)" = 0 ]; then
		chown -R "$run_user:" "$dir"
		runuser -u "$run_user" -- test -w "$dir/n1/mnesia" ||
			die "the $run_user user cannot write $dir (a parent directory is not searchable by it?); set SLUICE_CLUSTER_DIR"
	fi
}

boot_node() {
	local n="$1"
	as_user "$n" "$rmq_bin/rabbitmq-server" -detached >>"$dir/n$n/log/startup.log" 2>&1 ||
		die "rabbitmq-server for $(node_name "$n") failed; see $dir/n$n/log/startup.log"
}

await_node() {
	local n="$1"
	# wait reads the pid file the node writes early in its boot, then waits for the boot.
	if ! ctl "$n" -q wait "$(pid_file "$n")" --timeout "$timeout" >/dev/null 2>&1; then
		echo "rabbitmq-cluster: $(node_name "$n") did not boot within ${timeout}s; last log lines:" >&2
		tail -n 30 "$dir/n$n/log/"*.log >&2 2>/dev/null || true
		return 1
	fi
}

start() {
	local n t0 pids=()
	t0=$(date +%s.%N)
	command -v "$rmq_bin/rabbitmq-server" >/dev/null || die "rabbitmq-server not found (install RabbitMQ 3.10 or later)"
	if [ -f "$dir/.sluice-cluster" ] && clustered; then
		say "already running: $(urls)"
		return 0
	fi
	if [ -d "$dir" ] || [ -n "$(for n in $(seq 1 $nodes); do node_pids "$n"; done)" ]; then
		say "cleaning up what an earlier run left"
		[ -d "$dir" ] && touch "$dir/.sluice-cluster" 2>/dev/null || true
		stop_all
	fi
	for n in $(seq 1 $nodes); do
		port_free "$(amqp_port "$n")" || die "port $(amqp_port "$n") is in use by something else"
		port_free "$(dist_port "$n")" || die "port $(dist_port "$n") is in use by something else"
	done
	write_files
	for n in $(seq 1 $nodes); do boot_node "$n"; done
	for n in $(seq 1 $nodes); do
		await_node "$n" &
		pids+=($!)
	done
	for pid in "${pids[@]}"; do wait "$pid" || die "a node did not start; run '$0 stop' to clean up"; done
	for n in $(seq 1 $nodes); do
		say "started RabbitMQ $(logged_version "$dir/n$n/log") node $(node_name "$n") on 127.0.0.1:$(amqp_port "$n")"
	done
	# Nodes 2 and 3 join node 1 one after the other: concurrent joins race on the schema.
	# (start_app logs errors about tables of nodes still joining: noise, shown only on failure.)
	for n in $(seq 2 $nodes); do
		out="$(ctl "$n" -q stop_app 2>&1)" || die "stop_app on $(node_name "$n"): $out"
		out="$(ctl "$n" -q join_cluster "$(node_name 1)" 2>&1)" || die "$(node_name "$n") could not join $(node_name 1): $out"
		out="$(ctl "$n" -q start_app 2>&1)" || die "start_app on $(node_name "$n"): $out"
	done
	clustered || die "nodes started but do not form one cluster; see '$0 status'"
	say "started in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')s: $(urls)"
}

urls() {
	local n out=()
	for n in $(seq 1 $nodes); do out+=("amqp://guest:guest@127.0.0.1:$(amqp_port "$n")/"); done
	(
		IFS=,
		echo "${out[*]}"
	)
}

status() {
	local n rc=0
	for n in $(seq 1 $nodes); do
		if running "$n"; then
			echo "$(node_name "$n"): running, amqp 127.0.0.1:$(amqp_port "$n")"
		else
			echo "$(node_name "$n"): not running"
			rc=1
		fi
	done
	if [ $rc = 0 ]; then
		echo "cluster members running: $(running_members | tr '\n' ' ')"
	fi
	return $rc
}

# lock: start and stop of this cluster, one at a time.
lock() {
	mkdir -p "$(dirname "$dir")"
	exec 9>"$dir.lock"
	flock -w 600 9 || die "another start or stop of $dir holds $dir.lock"
}

# other_users: live processes other than SLUICE_CLUSTER_USER registered as users.
other_users() {
	local f pid
	for f in "$dir"/users/*; do
		[ -e "$f" ] || continue
		pid="$(basename "$f")"
		[ "$pid" = "${SLUICE_CLUSTER_USER:-}" ] && continue
		if kill -0 "$pid" 2>/dev/null; then echo "$pid"; else rm -f "$f"; fi
	done
}

case "${1:-}" in
start)
	lock
	start
	if [ -n "${SLUICE_CLUSTER_USER:-}" ]; then
		mkdir -p "$dir/users"
		touch "$dir/users/$SLUICE_CLUSTER_USER"
	fi
	;;
stop)
	lock
	if [ -n "${SLUICE_CLUSTER_USER:-}" ]; then
		rm -f "$dir/users/$SLUICE_CLUSTER_USER"
		others="$(other_users | tr '\n' ' ')"
		if [ -n "$others" ]; then
			say "left running: still used by pid $others"
			exit 0
		fi
	fi
	stop_all
	say "stopped"
	;;
status) status ;;
urls) urls ;;
ctl)
	shift
	n="${1:?ctl needs a node number 1..$nodes}"
	shift
	case "$n" in [1-9]) ;; *) die "node number $n: want 1..$nodes" ;; esac
	ctl "$n" "$@"
	;;
*)
	echo "usage: $0 start|stop|status|urls|ctl N ARGS…" >&2
	exit 2
	;;
esac
