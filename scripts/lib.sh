# Shell functions the scripts share (sourced, never run): ports, and who holds one.

# port_open PORT [HOST]: something accepts connections on HOST:PORT (default 127.0.0.1).
port_open() { (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null; }

# who_listens PORT: the process listening on PORT, as ss names it ("beam.smp",pid=…), or
# "another process" where ss cannot say.
who_listens() {
	local who=""
	command -v ss >/dev/null 2>&1 && who="$(ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'users:(([^)]*))' | head -1)"
	echo "${who:-another process}"
}

# node_ports_free PORT: a RabbitMQ node of the scripts' layout can use AMQP port PORT: it,
# its management port (PORT + 10000) and its distribution port (PORT + 20000) are free.
node_ports_free() {
	local p
	for p in "$1" $(($1 + 10000)) $(($1 + 20000)); do
		port_open "$p" && return 1
	done
	return 0
}

# node_ports_busy PORT: why a node cannot use AMQP port PORT (empty when it can).
node_ports_busy() {
	local p what
	for p in "$1" $(($1 + 10000)) $(($1 + 20000)); do
		case $((p - $1)) in 0) what="AMQP" ;; 10000) what="management" ;; *) what="distribution" ;; esac
		port_open "$p" && echo "port $p ($what) is in use by $(who_listens "$p")"
	done
	return 0
}

# free_node_port FIRST LAST: the first port from FIRST to LAST (the cluster scripts'
# 5681-5683 left out) that node_ports_free.
free_node_port() {
	local p
	for p in $(seq "$1" "$2"); do
		case "$p" in 5681 | 5682 | 5683) continue ;; esac
		node_ports_free "$p" && {
			echo "$p"
			return 0
		}
	done
	return 1
}

# series VERSION: its major.minor ("4.3.6" -> "4.3").
series() { echo "$1" | awk -F. '{print $1 "." $2}'; }

# logged_version LOGDIR: the version a node said it was starting, from its log ("4.3.6").
logged_version() {
	local v
	v="$(grep -ho 'Starting RabbitMQ [0-9][^ ]* on Erlang' "$1"/*.log 2>/dev/null | tail -1 | awk '{print $3}')"
	echo "${v:-(unknown: no boot line in $1)}"
}

# alive PID: the process runs (a zombie, ended but not reaped, does not).
alive() {
	[ -n "$1" ] && kill -0 "$1" 2>/dev/null || return 1
	local state
	state="$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)"
	[ "$state" != Z ]
}

# await_boot LOG OFFSET PIDFILE SECONDS: waits until a RabbitMQ node's log, past byte OFFSET,
# says "Server startup complete" (what rabbitmqctl wait waits for, without starting an
# Erlang VM for it); fails when the log says BOOT FAILED, the node's process is gone, or
# SECONDS pass.
await_boot() {
	local log=$1 offset=$2 pidfile=$3 deadline=$((SECONDS + $4)) pid
	while [ $SECONDS -lt $deadline ]; do
		if [ -f "$log" ]; then
			case "$(tail -c +$((offset + 1)) "$log" 2>/dev/null)" in
			*"Server startup complete"*) return 0 ;;
			*"BOOT FAILED"*) return 1 ;;
			esac
		fi
		pid="$(cat "$pidfile" 2>/dev/null || true)"
		if [ -n "$pid" ] && ! alive "$pid"; then return 1; fi
		sleep 0.2
	done
	return 1
}

# stop_node_pid PIDFILE: stops the node whose pid PIDFILE holds with SIGTERM (an orderly
# shutdown: the Erlang VM runs init:stop(), as rabbitmqctl stop does) and waits for it, up
# to a minute, then kills it. Nothing to stop: nothing done.
stop_node_pid() {
	local pid i
	pid="$(cat "$1" 2>/dev/null || true)"
	alive "$pid" && grep -q beam "/proc/$pid/comm" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq 1 600); do
		alive "$pid" || return 0
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
}
