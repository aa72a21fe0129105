#!/usr/bin/env bash
# What `make bench` runs: every benchmark, BENCH_ROUNDS rounds, on one broker, then one table
# of sluice beside its references (internal/benchkit/benchtable), headed by the broker's
# version. The broker is RabbitMQ 4.3 by default (node sluice43 on 127.0.0.1:5673, from the
# chroot scripts/rabbitmq4.sh makes, stopped afterwards if this run started it);
# BENCH_BROKER=3.10 uses the machine's RabbitMQ 3.10 at AMQP_URL instead.
#
# Environment:
#   GO, PKGS        the go command and the packages (default: go, ./...)
#   BENCH_ROUNDS    rounds (default 3)
#   BENCH_BROKER    4.3 (default) or 3.10
#   BENCH_RECORD    set to 1 to write the table into BENCHMARKS.md's section of that version
set -uo pipefail
cd "$(dirname "$0")/.."

GO="${GO:-go}"
PKGS="${PKGS:-./...}"
rounds="${BENCH_ROUNDS:-3}"
version="${BENCH_BROKER:-4.3}"
started43=0
case "$version" in
4.3)
	./scripts/rabbitmq4.sh status 2>/dev/null | grep -q '^running: sluice43@' || started43=1
	./scripts/rabbitmq4.sh start sluice43 5673 || {
		echo "make bench: RabbitMQ 4.3 could not be started (scripts/rabbitmq4.sh needs root and Debian's mirror); BENCH_BROKER=3.10 benchmarks the machine's RabbitMQ 3.10" >&2
		exit 1
	}
	export AMQP_URL="amqp://guest:guest@127.0.0.1:5673/"
	;;
3.10)
	export AMQP_URL="${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}"
	;;
*)
	echo "make bench: BENCH_BROKER must be 4.3 or 3.10, got $version" >&2
	exit 2
	;;
esac
export SLUICE_RABBITMQ="$version"
record=()
[ "${BENCH_RECORD:-0}" = 1 ] && record=(-record BENCHMARKS.md -section "RabbitMQ $version")
# shellcheck disable=SC2086 # PKGS is a list of patterns
"$GO" run ./internal/benchkit/benchtable -rounds "$rounds" "${record[@]}" -- \
	"$GO" test -p 1 -run '^$' -bench . -benchmem -count=1 -timeout 30m $PKGS
status=$?
[ "$started43" = 1 ] && { ./scripts/rabbitmq4.sh stop sluice43 >/dev/null 2>&1 || true; }
exit $status
