#!/usr/bin/env bash
# What `make test` runs: every test, with the race detector, in two parts:
#
#   1. RabbitMQ 4.3: every package, the chaos test and the fault suite, on a 4.3 node that
#      scripts/rabbitmq4.sh runs from a Debian sid chroot it makes once and caches in
#      .cache/rabbitmq4; tests that start nodes of their own start 4.3 ones.
#   2. RabbitMQ 3.10: the broker-facing contract suites (./test, broker/amqp, dlq, router, the
#      CLI and console, the examples), the partition test, and in CI a 3-minute soak, on a
#      3.10 node that scripts/rabbitmq310.sh runs from the machine's rabbitmq-server
#      (Debian 12's package). Without part 1 (SLUICE_TEST_RABBITMQ43=0, or no root), every
#      test runs here instead.
#
# It keeps to itself: it installs missing Debian packages only through apt-get, saying what
# and why first (scripts/provision.sh), and changes nothing else on the machine. Every
# service the tests use it starts from a folder of its own under .cache/ and stops at the
# end: PostgreSQL (scripts/postgres.sh), Jaeger (scripts/jaeger-start.sh) and the two
# RabbitMQ nodes, each on ports of its own (the first free ones). It never runs a test
# against a service it did not start, unless told to: AMQP_URL (a broker of 4.3.x runs part
# 1, of 3.10.x part 2), POSTGRES_URL or JAEGER_QUERY_URL given on purpose are used instead,
# and it says so. Each part is labelled with the version its node reports, and a node of
# another series than the part claims fails the run, naming the version found.
#
# It ends with the time per part, the slowest packages and tests, the RabbitMQ versions of
# every node the tests started, and a loud list of the tests that skipped and why: a test
# that cannot reach what it needs skips on a developer's machine (and fails where
# SLUICE_REQUIRE_BROKER=1, as in CI). go test's JSON of each part is kept in
# .cache/test-logs/ (the last five runs) for a closer look.
#
# Environment:
#   GO, PKGS               the go command and the packages (default: go, ./...)
#   AMQP_URL               a broker of your own for the part of its version (see above)
#   POSTGRES_URL           a PostgreSQL of your own (else scripts/postgres.sh's)
#   JAEGER_QUERY_URL       a Jaeger of your own, with OTEL_EXPORTER_OTLP_ENDPOINT (else ours)
#   SLUICE_TEST_PROVISION=0  install nothing and start no PostgreSQL
#   SLUICE_TEST_RABBITMQ43=0  leave out part 1 (RabbitMQ 4.3)
#   SLUICE_TEST_RABBITMQ310=0 leave out part 2 (RabbitMQ 3.10)
#   SLUICE_TEST_JAEGER=0   neither start nor stop a Jaeger (use JAEGER_QUERY_URL's)
#   SLUICE_TEST_RABBITMQ=4.3|3.10  one part only (make test RABBITMQ=4.3): with PKGS, one
#                          package on one version, its node started and stopped for it
#   SLUICE_TEST_CHAOS=0|1  leave out or add the chaos test (default: in a whole run, or
#                          when PKGS names ./test/chaos)
#   SLUICE_TEST_FAULTS=0|1 the same for the fault suite (test/faults)
#   SLUICE_TEST_SIDE_BY_SIDE=0  part 2's contract suites after part 1, not beside its packages
#   SLUICE_TEST_SOAK       0: leave out test/soak; 1: its unit tests; ci: those and a 3-minute
#                          soak (default: ci under CI=true, else 1; 0 when PKGS is not ./...)
#   SLUICE_RABBITMQ4_CACHE  where the 4.3 chroot is cached (scripts/rabbitmq4.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

GO="${GO:-go}"
PKGS="${PKGS:-./...}"
work="$(mktemp -d)"
record="$work/run.jsonl"
timing="$work/timing"
begin_all=$SECONDS

say() { echo "make test: $*"; }
masked() { echo "$1" | sed -E 's#(://[^:/@]*:)[^@/]*@#\1xxxxx@#g'; }
host="$(hostname -s 2>/dev/null || echo localhost)"
# Node names of this checkout's own: two checkouts sharing a chroot never clash.
tag="$(printf '%s' "$PWD" | md5sum | cut -c1-6)"
node43="sluicetest43-$tag"
node310="sluicetest310-$tag"

# Everything this run starts, stopped at the end whatever happens (in reverse order).
stops=()
cleanup() {
	local i pids=()
	for ((i = ${#stops[@]} - 1; i >= 0; i--)); do
		eval "${stops[$i]}" >/dev/null 2>&1 &
		pids+=($!)
	done
	for i in "${pids[@]}"; do wait "$i"; done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'say "interrupted; stopping what this run started"; exit 130' INT TERM

# This run's JSON in a folder of its own (a make test a test runs must not clear it); the
# last five runs are kept.
logs=".cache/test-logs/$(date +%Y%m%d-%H%M%S)-$$"
mkdir -p "$logs"
ls -d .cache/test-logs/*/ 2>/dev/null | sort | head -n -5 | xargs -r rm -rf

# The parts this run has, and the services they need.
v43="${SLUICE_TEST_RABBITMQ43:-1}"
v310="${SLUICE_TEST_RABBITMQ310:-1}"
case "${SLUICE_TEST_RABBITMQ:-}" in
"") ;;
4.3) v310=0 ;;
3.10) v43=0 ;;
*)
	say "SLUICE_TEST_RABBITMQ (make test RABBITMQ=) is 4.3 or 3.10, not ${SLUICE_TEST_RABBITMQ}"
	exit 2
	;;
esac
# The chaos test and the fault suite run in a whole run, and when PKGS names them.
chaos="${SLUICE_TEST_CHAOS:-}" faults="${SLUICE_TEST_FAULTS:-}"
if [ "$PKGS" = ./... ]; then
	chaos="${chaos:-1}" faults="${faults:-1}"
else
	case " $PKGS " in *" ./test/chaos"*) chaos="${chaos:-1}" ;; esac
	case " $PKGS " in *" ./test/faults"*) faults="${faults:-1}" ;; esac
	chaos="${chaos:-0}" faults="${faults:-0}"
	# Those two need their build tags: go test alone would find no test in them.
	PKGS="$(echo " $PKGS " | sed -E 's# \./test/(chaos|faults)/?(\.\.\.)? # #g; s/^ +//; s/ +$//')"
fi
provision="${SLUICE_TEST_PROVISION:-1}"
jaeger="${SLUICE_TEST_JAEGER:-1}"
require_broker="${SLUICE_REQUIRE_BROKER:-0}"

say "every test with -race: part 1 on RabbitMQ 4.3, part 2 on RabbitMQ 3.10 (scripts/test.sh says what each runs)"
say "it starts what the tests use from folders under .cache/ and stops it at the end; it changes nothing else on this machine"

# What needs the machine: packages (scripts/provision.sh says what, why and how big first).
[ "$provision" != 0 ] && ./scripts/provision.sh

# A broker given on purpose runs the part of its version; no node is started for it.
url43="" url310="" given=""
if [ -n "${AMQP_URL:-}" ]; then
	given="$AMQP_URL"
fi

# The helpers: the output filter and the broker version reader, built once.
"$GO" build -o "$work/" ./internal/testkit/testsummary ./internal/testkit/brokerversion || exit 1
summary="$work/testsummary"
module="$("$GO" list -m)"
brokerversion="$work/brokerversion"

if [ -n "$given" ]; then
	if gv="$("$brokerversion" "$given" 2>"$work/given.err")"; then
		case "$(series "$gv")" in
		4.3)
			url43="$given"
			say "AMQP_URL is set: part 1 runs on the node you gave, RabbitMQ $gv at $(masked "$given") (not started here)"
			;;
		3.10)
			url310="$given"
			say "AMQP_URL is set: part 2 runs on the node you gave, RabbitMQ $gv at $(masked "$given") (not started here)"
			;;
		*)
			say "AMQP_URL ($(masked "$given")) is RabbitMQ $gv: make test's parts run on 4.3.x (part 1) and 3.10.x (part 2), not $(series "$gv"); unset AMQP_URL to let make test start both"
			exit 1
			;;
		esac
	else
		# Nothing answers there: the tests run against it anyway and skip (or fail in CI),
		# as asked; it stands for the 3.10 part, AMQP_URL's meaning before 4.3 was added.
		url310="$given"
		say "AMQP_URL is set but its node does not answer ($(cat "$work/given.err")); part 2 runs against it: its broker tests skip (fail under SLUICE_REQUIRE_BROKER=1)"
	fi
fi

# Boots take a while: the nodes boot in the background while the rest starts, and the 3.10
# node's boot overlaps part 1.
start_node() { # VERSION SCRIPT NAME LOG
	local rc=0
	# A fresh node: what an earlier run left (a killed make test) is stopped and removed.
	[ "$1" = 4.3 ] && "$2" reset "$3" >/dev/null 2>&1
	"$2" start "$3" auto >"$4" 2>&1 || rc=$?
	echo "RabbitMQ $1 node: started in the background, ready $((SECONDS - begin_all)) s after make test began" >>"$timing"
	return $rc
}
pid43="" pid310=""
if [ "$v43" != 0 ] && [ -z "$url43" ]; then
	if [ "$(id -u)" != 0 ]; then
		msg="RabbitMQ 4.3 cannot run here: scripts/rabbitmq4.sh needs root for its chroot (running as $(id -un))"
		[ "$require_broker" = 1 ] && {
			say "$msg; SLUICE_REQUIRE_BROKER=1"
			exit 1
		}
		say "$msg; PART 1 IS LEFT OUT and every test runs on 3.10 alone"
		v43=0
	else
		stops+=("./scripts/rabbitmq4.sh reset $node43")
		start_node 4.3 ./scripts/rabbitmq4.sh "$node43" "$work/node43.log" &
		pid43=$!
	fi
fi
if [ "$v310" != 0 ] && [ -z "$url310" ]; then
	stops+=("./scripts/rabbitmq310.sh stop $node310")
	start_node 3.10 ./scripts/rabbitmq310.sh "$node310" "$work/node310.log" &
	pid310=$!
fi

# PostgreSQL for the outbox's SQL forwarder tests, from .cache/postgres.
if [ -n "${POSTGRES_URL:-}" ]; then
	say "POSTGRES_URL is set: the outbox tests use $(masked "$POSTGRES_URL") (not started here)"
elif [ "$provision" != 0 ]; then
	stops+=("./scripts/postgres.sh stop")
	if pg="$(./scripts/postgres.sh start 2>&1)"; then
		echo "$pg" | grep -v '^postgres://'
		export POSTGRES_URL="$(echo "$pg" | tail -1)"
	else
		echo "$pg"
		say "PostgreSQL could not be started here; the outbox's SQL tests skip (fail under SLUICE_REQUIRE_POSTGRES=1)"
	fi
fi

# Jaeger, this checkout's own (on other ports when another holds the defaults).
if [ -n "${JAEGER_QUERY_URL:-}" ]; then
	say "JAEGER_QUERY_URL is set: the tracing tests use $JAEGER_QUERY_URL and OTLP ${OTEL_EXPORTER_OTLP_ENDPOINT:-http://127.0.0.1:4318} (not started here)"
elif [ "$jaeger" != 0 ]; then
	stops+=("./scripts/jaeger-stop.sh")
	if JAEGER_OWN=1 ./scripts/jaeger-start.sh; then
		set -a
		# shellcheck disable=SC1091
		. .cache/jaeger.env
		set +a
	else
		[ "${SLUICE_REQUIRE_JAEGER:-0}" = 1 ] && exit 1
		say "Jaeger not started; its tests skip"
	fi
fi

# The compose file: docker compose checks it where it is installed (no engine needed).
compose_check() {
	if docker compose version >/dev/null 2>&1; then
		docker compose -f docker-compose.yml config -q && say "docker-compose.yml: docker compose config accepts it"
	elif command -v docker-compose >/dev/null 2>&1; then
		docker-compose -f docker-compose.yml config -q && say "docker-compose.yml: docker-compose config accepts it"
	else
		say "docker-compose.yml: NOT CHECKED, no docker compose here (the deploy package's test still reads it)"
	fi
}
status=0
compose_check || {
	say "docker-compose.yml: docker compose config refuses it (above)"
	status=1
}

# await_node PID LOG SCRIPT NAME VAR: waits for the node's boot (in this shell: a subshell
# cannot wait for it), prints what its script said, and sets VAR to its URL.
await_node() {
	local pid=$1 log=$2 script=$3 name=$4 rc=0
	wait "$pid" || rc=$?
	cat "$log"
	[ $rc = 0 ] || return 1
	printf -v "$5" 'amqp://guest:guest@127.0.0.1:%s/' "$("$script" port "$name")"
}

# version_of URL SERIES: the node's version, or a loud failure naming what it is (on stderr:
# the version is the output).
version_of() {
	local v
	if ! v="$("$brokerversion" -series "$2" "$1" 2>"$work/version.err")"; then
		if [ -n "$v" ]; then
			say "the node for the RabbitMQ $2 part is RabbitMQ $v, not $2.x: the run would be labelled with a version it does not test; FAIL" >&2
		else
			say "the node for the RabbitMQ $2 part does not answer: $(cat "$work/version.err")" >&2
		fi
		return 1
	fi
	# The docs name the release make test runs: a new one is news for them.
	grep -q "RabbitMQ $v\*\*" docs/reliability.md 2>/dev/null ||
		say "NOTE: this run tests RabbitMQ $v, which docs/reliability.md (RabbitMQ versions) does not name: update it, README.md and docker-compose.yml" >&2
	echo "$v"
}

if [ -n "$pid43" ]; then
	if ! await_node "$pid43" "$work/node43.log" ./scripts/rabbitmq4.sh "$node43" url43; then
		if [ "$require_broker" = 1 ]; then
			say "RabbitMQ 4.3 could not be started here (above); SLUICE_REQUIRE_BROKER=1"
			exit 1
		fi
		say "RabbitMQ 4.3 could not be started here (above); PART 1 IS LEFT OUT and every test runs on 3.10 alone"
		v43=0
	fi
fi
label43="" label310=""
if [ "$v43" != 0 ]; then
	v="$(version_of "$url43" 4.3)" || exit 1
	label43="RabbitMQ $v"
	p1=(AMQP_URL="$url43" SLUICE_RABBITMQ=4.3)
	[ -n "$pid43" ] && p1+=(SLUICE_RABBITMQ_NODE="$node43@$host")
fi
if [ "$v310" != 0 ]; then
	if [ -n "$pid310" ] && ! await_node "$pid310" "$work/node310.log" ./scripts/rabbitmq310.sh "$node310" url310; then
		say "RabbitMQ 3.10 could not be started here (above); part 2 cannot run"
		exit 1
	fi
	if v="$(version_of "$url310" 3.10)"; then
		label310="RabbitMQ $v"
	elif [ -n "$given" ] && [ "$url310" = "$given" ] && ! "$brokerversion" "$given" >/dev/null 2>&1; then
		# An AMQP_URL given on purpose that does not answer: its tests skip (fail in CI).
		label310="RabbitMQ 3.10"
	else
		exit 1
	fi
	p2=(AMQP_URL="$url310" SLUICE_RABBITMQ=3.10)
	if [ -n "$pid310" ]; then
		# The node's programs run through its script (its cookie and port mapper).
		p2+=(SLUICE_RABBITMQ_NODE="$node310@$host" SLUICE_RABBITMQ_RUN="$PWD/scripts/rabbitmq310.sh run")
	fi
fi

# part NAME LABEL [VAR=VALUE...] ARGS...: go test ARGS with the variables set, its output
# filtered (the part's version on each closing line and skip), its JSON kept in
# .cache/test-logs/NAME.json.
part() {
	local name=$1 label=$2 begin=$SECONDS rc=0
	shift 2
	local -a vars=()
	while [[ "${1:-}" == [A-Z]*=* ]]; do
		vars+=("$1")
		shift
	done
	env "${vars[@]}" "$GO" test -json "$@" 2>&1 | tee "$logs/$name.json" | "$summary" -skips "$record" -label "$label" || rc=1
	local desc="$*"
	desc="${desc//$module\//./}"
	[ ${#desc} -le 150 ] || desc="${desc:0:147}..."
	echo "$label: go test $desc ($((SECONDS - begin)) s)" >>"$timing"
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

# The broker-facing contract suites, which part 2 runs on 3.10 beside part 1's 4.3.
contract="./test/ ./broker/... ./dlq/... ./router/... ./cmd/... ./examples/..."
pkgs310="$PKGS"
[ "$v43" != 0 ] && [ "$PKGS" = ./... ] && pkgs310="$contract"

# go test runs packages in the order it is given them, two at a time (one per core), and
# ./... is alphabetical: ./test, which takes longest (its tests run one after another), used
# to start near the end and run alone for a quarter of an hour. The slowest packages go
# first (measured in make test's own runs), the rest fill in beside them.
# Part 2's contract suites, beside part 1's packages, start ./test a few minutes later, so
# that the same heavy tests (16 MiB messages, the browser) do not run on both at once.
slow1="test test/cluster outbox broker/amqp cmd/sluice/internal/console cmd/sluice failover router dlq"
slow2="broker/amqp cmd/sluice/internal/console test cmd/sluice router dlq"
order() { # SLOW PATTERNS...: the packages of PATTERNS, those in SLOW first, in its order
	local slow=$1 all p
	shift
	all="$("$GO" list "$@")" || return 1
	for p in $slow; do
		grep -qx "$module/$p" <<<"$all" && echo "$module/$p"
	done
	grep -vx -F -f <(for p in $slow; do echo "$module/$p"; done) <<<"$all" || true
}
pkgs1=""
if [ -n "$PKGS" ]; then
	# shellcheck disable=SC2086 # PKGS is a list of patterns
	pkgs1="$(order "$slow1" $PKGS | tr '\n' ' ')" || exit 1
	slow2_now="$slow1"
	[ "$v43" != 0 ] && [ "${SLUICE_TEST_SIDE_BY_SIDE:-1}" != 0 ] && slow2_now="$slow2"
	# shellcheck disable=SC2086
	pkgs310="$(order "$slow2_now" $pkgs310 | tr '\n' ' ')" || exit 1
fi

dirty_before="$(git status --porcelain 2>/dev/null || true)"

# The soak in CI: 3 minutes of make soak's load on 3.10 (make soak runs 30 by default),
# its channels counted through the node's management API. It judges growth (memory,
# goroutines, connections, channels), not timing, so with both parts it runs beside the
# chaos test (its own 4.3 node), which judges no timing either; soak_done says it ran.
soak_done=0
soak_ci() {
	local p=("${p2[@]}")
	[ -n "$pid310" ] && p+=(RABBITMQ_MANAGEMENT_URL="http://guest:guest@127.0.0.1:$(($(./scripts/rabbitmq310.sh port "$node310") + 10000))")
	part 2-soak "$label310" "${p[@]}" SOAK_DURATION=3m -race -count=1 -timeout 15m -tags soak -run '^TestSoak$' ./test/soak/
}

# The run, in phases. Side by side runs only what judges no timing another's load would
# shift, and what is used to running beside other packages (go test runs two at a time):
#   1. part 1's packages on 4.3 and, beside them, part 2's contract suites on 3.10 (its
#      output printed when it ends);
#   2. the chaos and saga tests (4.3), beside the soak on 3.10 in CI (neither judges timing:
#      the chaos test restarts its node under load, the soak judges growth);
#   3. the fault suite (4.3), alone: it judges timing;
#   4. the partition test on 3.10, alone, for the same reason;
#   5. the soak (3.10, in CI) here when it did not run beside the chaos test.
# Without part 1, part 2 runs all of this on 3.10, one after the other.
if [ "$v43" != 0 ]; then
	say "part 1: every test on $label43 ($(masked "$url43"))"
	pid2=""
	if [ "$v310" != 0 ] && [ -n "$pkgs1" ] && [ "${SLUICE_TEST_SIDE_BY_SIDE:-1}" != 0 ]; then
		say "part 2: the contract suites on $label310 ($(masked "$url310")), beside part 1; its lines follow part 1's"
		# shellcheck disable=SC2086
		part 2-contract "$label310" "${p2[@]}" -race -count=1 -timeout 25m $pkgs310 >"$work/2-contract.out" 2>&1 &
		pid2=$!
	fi
	if [ -n "$pkgs1" ]; then
		# shellcheck disable=SC2086 # a list of packages
		part 1-packages "$label43" "${p1[@]}" -race -count=1 -timeout 25m $pkgs1 || status=1
	fi
	# The soak's own unit tests (its growth detector and table), which need no broker.
	if [ "$soak" != 0 ]; then part 1-soak-units "$label43" "${p1[@]}" -race -count=1 -tags soak -skip '^TestSoak$' ./test/soak/ || status=1; fi
	if [ -n "$pid2" ]; then
		wait "$pid2" || status=1
		cat "$work/2-contract.out"
	fi
	pidsoak=""
	if [ "$chaos" != 0 ] && [ "$v310" != 0 ] && [ "$soak" = ci ]; then
		soak_ci >"$work/2-soak.out" 2>&1 &
		pidsoak=$!
		soak_done=1
	fi
	if [ "$chaos" != 0 ]; then
		part 1-chaos "$label43" "${p1[@]}" -race -count=1 -timeout 15m -tags chaos -run 'Chaos|Saga' ./test/chaos/ || status=1
	fi
	if [ -n "$pidsoak" ]; then
		wait "$pidsoak" || status=1
		cat "$work/2-soak.out"
	fi
	if [ "$faults" != 0 ]; then
		# The network and broker fault suite: nodes of its own, never beside other broker tests.
		# The partition scenario runs here and again on 3.10 (part 2): a 4.3 minority keeps
		# its clients' connections and stops confirming, 3.10's pauses and closes them, and
		# sluice's publisher must leave both (docs/reliability.md, RabbitMQ versions).
		part 1-faults "$label43" "${p1[@]}" -race -count=1 -timeout 20m -tags faults ./test/faults/ || status=1
	fi
	# Its node is not needed any more: it stops while part 2 goes on.
	if [ -n "$pid43" ]; then ./scripts/rabbitmq4.sh reset "$node43" >/dev/null 2>&1 & fi
	if [ "$v310" != 0 ]; then
		if [ -n "$pkgs1" ] && [ -z "$pid2" ]; then
			say "part 2: the contract suites on $label310 ($(masked "$url310"))"
			# shellcheck disable=SC2086
			part 2-contract "$label310" "${p2[@]}" -race -count=1 -timeout 25m $pkgs310 || status=1
		fi
		if [ "$faults" != 0 ]; then
			part 2-partition "$label310" "${p2[@]}" -race -count=1 -timeout 15m -tags faults -run '^TestPartition$' ./test/faults/ || status=1
		fi
	fi
elif [ "$v310" != 0 ]; then
	say "every test on $label310 ($(masked "$url310"))"
	if [ -n "$pkgs1" ]; then
		# shellcheck disable=SC2086
		part 2-packages "$label310" "${p2[@]}" -race -count=1 -timeout 25m $pkgs310 || status=1
	fi
	if [ "$soak" != 0 ]; then part 2-soak-units "$label310" "${p2[@]}" -race -count=1 -tags soak -skip '^TestSoak$' ./test/soak/ || status=1; fi
	if [ "$chaos" != 0 ]; then
		part 2-chaos "$label310" "${p2[@]}" -race -count=1 -timeout 15m -tags chaos -run 'Chaos|Saga' ./test/chaos/ || status=1
	fi
	if [ "$faults" != 0 ]; then
		part 2-faults "$label310" "${p2[@]}" -race -count=1 -timeout 20m -tags faults ./test/faults/ || status=1
	fi
fi
if [ "$soak_done" = 0 ] && [ "$v310" != 0 ] && [ "$soak" = ci ]; then
	soak_ci || status=1
fi

"$summary" -report "$record"
# make test leaves the tree as it found it (tests write under temporary or ignored folders).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	dirty="$(git status --porcelain 2>/dev/null | grep -v -x -F -f <(echo "$dirty_before") || true)"
	if [ -n "$dirty" ]; then
		say "WARNING: the tests changed the tree (a test writes where it should not):"
		echo "$dirty" | sed 's/^/  /'
	fi
fi
echo
echo "make test: time per part ($((SECONDS - begin_all)) s in all)"
sed 's/^/  /' "$timing" 2>/dev/null
if [ $status = 0 ]; then say "PASS"; else say "FAIL"; fi
exit $status
