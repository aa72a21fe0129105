#!/usr/bin/env bash
# What `make test` runs, with the race detector, against RabbitMQ and Jaeger, in two parts:
#
#   1. RabbitMQ 4.3: every test, then the chaos test and the fault suite, on a 4.3 node
#      (sluice43 on 127.0.0.1:5673) that scripts/rabbitmq4.sh runs from a Debian sid chroot
#      it makes once and caches; tests that start nodes of their own start 4.3 ones
#      (SLUICE_RABBITMQ=4.3).
#   2. RabbitMQ 3.10 (the machine's own, AMQP_URL): the broker-facing contract suites
#      (./test, broker/amqp, dlq, router, the CLI and console, the examples). Without part 1
#      (SLUICE_TEST_RABBITMQ43=0, or not root), every test runs here instead.
#
# It starts RabbitMQ 3.10 when it is installed and not running (rabbitmq-server, else
# `docker compose up -d rabbitmq` where a Docker engine runs), and ends with a loud list of
# the tests that skipped and why, each with the version it ran on: a test that cannot reach
# what it needs skips on a developer's machine (and fails where SLUICE_REQUIRE_BROKER=1, as
# in CI).
#
# Environment:
#   GO, PKGS               the go command and the packages (default: go, ./...)
#   AMQP_URL               the 3.10 broker (default amqp://guest:guest@127.0.0.1:5672/)
#   SLUICE_TEST_START=0    never start RabbitMQ
#   SLUICE_TEST_PROVISION=0  install nothing, start no PostgreSQL (scripts/provision.sh)
#   SLUICE_TEST_RABBITMQ43=0  leave out part 1 (RabbitMQ 4.3)
#   SLUICE_TEST_JAEGER=0   neither start nor stop the local Jaeger (use JAEGER_QUERY_URL's)
#   SLUICE_TEST_CHAOS=0    leave out the chaos test
#   SLUICE_TEST_FAULTS=0   leave out the fault suite (test/faults)
#   SLUICE_TEST_SOAK       0: leave out test/soak; 1: its unit tests; ci: those and a 3-minute
#                          soak (default: ci under CI=true, else 1; 0 when PKGS is not ./...)
set -uo pipefail
cd "$(dirname "$0")/.."

GO="${GO:-go}"
PKGS="${PKGS:-./...}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
skips="$work/skips.jsonl"

say() { echo "make test: $*"; }
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# What the tests need on the machine: packages, PostgreSQL (scripts/provision.sh).
[ "${SLUICE_TEST_PROVISION:-1}" != 0 ] && ./scripts/provision.sh

# The broker's host and port, from AMQP_URL's first node.
url="${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}"
hostport="${url%%,*}"
hostport="${hostport#*://}"
hostport="${hostport#*@}"
hostport="${hostport%%/*}"
host="${hostport%:*}"
port="${hostport##*:}"
[ "$port" = "$hostport" ] && port=5672
[ "$host" = localhost ] && host=127.0.0.1

start_rabbitmq() {
	[ "${SLUICE_TEST_START:-1}" = 0 ] && return 1
	# Only the local default node can be started from here.
	[ "$host" = 127.0.0.1 ] && [ "$port" = 5672 ] || return 1
	if command -v rabbitmq-server >/dev/null 2>&1; then
		say "RabbitMQ is not running on 127.0.0.1:5672; starting it (rabbitmq-server -detached)"
		rabbitmq-server -detached || return 1
	elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
		say "RabbitMQ is not running on 127.0.0.1:5672; starting it (docker compose up -d rabbitmq)"
		docker compose up -d rabbitmq || return 1
	else
		return 1
	fi
	for _ in $(seq 1 120); do
		if port_open 127.0.0.1 5672; then
			# The port opens before the node accepts connections; rabbitmqctl knows when.
			if ! command -v rabbitmqctl >/dev/null 2>&1 || rabbitmqctl -q await_startup >/dev/null 2>&1; then
				say "RabbitMQ is up"
				return 0
			fi
		fi
		sleep 1
	done
	say "RabbitMQ did not come up on 127.0.0.1:5672 within 2 minutes" >&2
	return 1
}

if ! port_open "$host" "$port"; then
	if ! start_rabbitmq; then
		if [ "${SLUICE_REQUIRE_BROKER:-0}" = 1 ]; then
			say "RabbitMQ is not reachable at $host:$port and could not be started here; its tests will fail (SLUICE_REQUIRE_BROKER=1)"
		else
			say "RabbitMQ is not reachable at $host:$port and could not be started here; its tests will skip (see the summary at the end)"
		fi
	fi
fi

jaeger="${SLUICE_TEST_JAEGER:-1}"
if [ "$jaeger" != 0 ]; then
	./scripts/jaeger-start.sh || {
		[ "${SLUICE_REQUIRE_JAEGER:-0}" = 1 ] && exit 1
		say "Jaeger not started; its tests will skip"
	}
fi

git status --porcelain >"$work/dirty-before" 2>/dev/null || : >"$work/dirty-before"
summary="$work/testsummary"
"$GO" build -o "$summary" ./internal/testkit/testsummary || exit 1

# The broker-facing contract suites, which part 2 runs on 3.10 beside part 1's 4.3.
contract="./test/ ./broker/... ./dlq/... ./router/... ./cmd/... ./examples/..."
v43="${SLUICE_TEST_RABBITMQ43:-1}"
url43="amqp://guest:guest@127.0.0.1:5673/"
timing="$work/timing"
if [ "$v43" != 0 ]; then
	begin=$SECONDS
	# Stopped at the end only if this run started it.
	started43=1
	./scripts/rabbitmq4.sh status 2>/dev/null | grep -q '^running: sluice43@' && started43=0
	if ./scripts/rabbitmq4.sh start sluice43 5673; then
		echo "rabbitmq 4.3 ready: $((SECONDS - begin)) s" >>"$timing"
	else
		if [ "${SLUICE_REQUIRE_BROKER:-0}" = 1 ]; then
			say "RabbitMQ 4.3 could not be started here (scripts/rabbitmq4.sh); SLUICE_REQUIRE_BROKER=1"
			exit 1
		fi
		say "RabbitMQ 4.3 could not be started here (scripts/rabbitmq4.sh needs root and Debian's mirror); every test runs on 3.10 alone"
		v43=0
	fi
fi

# part LABEL ARGS...: suite ARGS with the part's version on each closing line and skip.
part() {
	local label=$1 begin=$SECONDS rc=0
	shift
	"$GO" test -json "$@" 2>&1 | "$summary" -skips "$skips" -label "$label" || rc=1
	echo "$label: go test $* ($((SECONDS - begin)) s)" >>"$timing"
	return $rc
}

# The soak (test/soak): its unit tests in every full run, and a 3-minute soak in CI.
soak="${SLUICE_TEST_SOAK:-}"
if [ -z "$soak" ]; then
	soak=0
	if [ "$PKGS" = ./... ]; then
		soak=1
		[ "${CI:-}" = true ] && soak=ci
	fi
fi

status=0
if [ "$v43" != 0 ]; then
	say "part 1: every test on RabbitMQ 4.3 ($url43)"
	export SLUICE_RABBITMQ=4.3
	# shellcheck disable=SC2086 # PKGS is a list of patterns
	AMQP_URL="$url43" part "RabbitMQ 4.3" -race -count=1 -timeout 25m $PKGS || status=1
	# The soak's own unit tests (its growth detector and table), which need no broker.
	[ "$soak" != 0 ] && { part "RabbitMQ 4.3" -race -count=1 -tags soak -skip '^TestSoak$' ./test/soak/ || status=1; }
	if [ "${SLUICE_TEST_CHAOS:-1}" != 0 ]; then
		AMQP_URL="$url43" part "RabbitMQ 4.3" -race -count=1 -timeout 15m -tags chaos -run Chaos ./test/chaos/ || status=1
	fi
	if [ "${SLUICE_TEST_FAULTS:-1}" != 0 ]; then
		# The network and broker fault suite: nodes of its own, never beside other broker tests.
		# The partition scenario runs here and again on 3.10 (part 2): a 4.3 minority keeps
		# its clients' connections and stops confirming, 3.10's pauses and closes them, and
		# sluice's publisher must leave both (docs/reliability.md, RabbitMQ versions).
		AMQP_URL="$url43" part "RabbitMQ 4.3" -race -count=1 -timeout 20m -tags faults ./test/faults/ || status=1
	fi
	[ "$started43" = 1 ] && { ./scripts/rabbitmq4.sh stop sluice43 >/dev/null 2>&1 || true; }
	unset SLUICE_RABBITMQ
	say "part 2: the contract suites on RabbitMQ 3.10 ($url)"
	pkgs3="$contract"
	[ "$PKGS" != ./... ] && pkgs3="$PKGS"
	# shellcheck disable=SC2086
	SLUICE_RABBITMQ=3.10 part "RabbitMQ 3.10" -race -count=1 -timeout 25m $pkgs3 || status=1
	if [ "${SLUICE_TEST_FAULTS:-1}" != 0 ]; then
		SLUICE_RABBITMQ=3.10 part "RabbitMQ 3.10" -race -count=1 -timeout 15m -tags faults -run '^TestPartition$' ./test/faults/ || status=1
	fi
	if [ "$soak" = ci ]; then
		# The soak in CI: 3 minutes of make soak's load on 3.10 (make soak runs 30 by default).
		SLUICE_RABBITMQ=3.10 SOAK_DURATION=3m part "RabbitMQ 3.10" -race -count=1 -timeout 15m -tags soak -run '^TestSoak$' ./test/soak/ || status=1
	fi
else
	# shellcheck disable=SC2086
	SLUICE_RABBITMQ=3.10 part "RabbitMQ 3.10" -race -count=1 -timeout 25m $PKGS || status=1
	[ "$soak" != 0 ] && { part "RabbitMQ 3.10" -race -count=1 -tags soak -skip '^TestSoak$' ./test/soak/ || status=1; }
	if [ "${SLUICE_TEST_CHAOS:-1}" != 0 ]; then
		SLUICE_RABBITMQ=3.10 part "RabbitMQ 3.10" -race -count=1 -timeout 15m -tags chaos -run Chaos ./test/chaos/ || status=1
	fi
	if [ "${SLUICE_TEST_FAULTS:-1}" != 0 ]; then
		SLUICE_RABBITMQ=3.10 part "RabbitMQ 3.10" -race -count=1 -timeout 20m -tags faults ./test/faults/ || status=1
	fi
	if [ "$soak" = ci ]; then
		SLUICE_RABBITMQ=3.10 SOAK_DURATION=3m part "RabbitMQ 3.10" -race -count=1 -timeout 15m -tags soak -run '^TestSoak$' ./test/soak/ || status=1
	fi
fi

if [ "$jaeger" != 0 ]; then
	./scripts/jaeger-stop.sh >/dev/null 2>&1 || true
fi
"$summary" -report "$skips"
# make test leaves the tree as it found it (tests write under temporary or ignored folders).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	dirty="$(git status --porcelain 2>/dev/null | grep -v -x -F -f "$work/dirty-before" || true)"
	if [ -n "$dirty" ]; then
		say "WARNING: the tests changed the tree (a test writes where it should not):"
		echo "$dirty" | sed 's/^/  /'
	fi
fi
echo
echo "make test: time per part"
sed 's/^/  /' "$timing" 2>/dev/null
if [ $status = 0 ]; then say "PASS"; else say "FAIL"; fi
exit $status
