#!/usr/bin/env bash
# What `make bench` runs: every benchmark, BENCH_ROUNDS rounds, on one broker, then one table
# of sluice beside its references (internal/benchkit/benchtable), headed by the broker's
# version as the node reports it. The broker is a node of this run's own, stopped afterwards:
# RabbitMQ 4.3 by default (from the chroot scripts/rabbitmq4.sh makes), BENCH_BROKER=3.10 for
# one from the machine's rabbitmq-server (scripts/rabbitmq310.sh), each on the first free
# port; AMQP_URL given on purpose is benchmarked instead (its version must be BENCH_BROKER's).
#
# Environment:
#   GO, PKGS        the go command and the packages (default: go, ./...)
#   BENCH_ROUNDS    rounds (default 3)
#   BENCH_BROKER    4.3 (default) or 3.10
#   BENCH_RECORD    set to 1 to write the table into BENCHMARKS.md's section of that version
#   AMQP_URL        a broker of your own to benchmark (not started here)
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

GO="${GO:-go}"
PKGS="${PKGS:-./...}"
rounds="${BENCH_ROUNDS:-3}"
version="${BENCH_BROKER:-4.3}"
host="$(hostname -s 2>/dev/null || echo localhost)"
tag="$(printf '%s' "$PWD" | md5sum | cut -c1-6)"
say() { echo "make bench: $*"; }

case "$version" in
4.3) script=./scripts/rabbitmq4.sh name="sluicebench43-$tag" ;;
3.10) script=./scripts/rabbitmq310.sh name="sluicebench310-$tag" ;;
*)
	say "BENCH_BROKER must be 4.3 or 3.10, got $version"
	exit 2
	;;
esac
export SLUICE_RABBITMQ="$version"

started=0
if [ -n "${AMQP_URL:-}" ]; then
	say "AMQP_URL is set: benchmarking the node you gave (not started here)"
else
	# The script says why a node cannot start (not root, a port in use, a failed boot).
	if ! "$script" start "$name" auto; then
		say "RabbitMQ $version could not be started (above)"
		exit 1
	fi
	started=1
	trap '"$script" stop "$name" >/dev/null 2>&1 || true' EXIT
	export AMQP_URL="amqp://guest:guest@127.0.0.1:$("$script" port "$name")/"
	export SLUICE_RABBITMQ_NODE="$name@$host"
	[ "$version" = 3.10 ] && export SLUICE_RABBITMQ_RUN="$PWD/scripts/rabbitmq310.sh run"
fi
# The version the node reports, of the series asked for (else the table would be mislabelled).
if ! v="$("$GO" run ./internal/testkit/brokerversion -series "$version" "$AMQP_URL")"; then
	say "the node is not RabbitMQ $version.x${v:+ (it is $v)}; no benchmark run"
	exit 1
fi
say "benchmarking RabbitMQ $v"
record=()
[ "${BENCH_RECORD:-0}" = 1 ] && record=(-record BENCHMARKS.md -section "RabbitMQ $version")
# shellcheck disable=SC2086 # PKGS is a list of patterns
"$GO" run ./internal/benchkit/benchtable -rounds "$rounds" "${record[@]}" -- \
	"$GO" test -p 1 -run '^$' -bench . -benchmem -count=1 -timeout 30m $PKGS
status=$?
[ "$started" = 1 ] && "$script" stop "$name" >/dev/null 2>&1
trap - EXIT
exit $status
