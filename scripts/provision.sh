#!/usr/bin/env bash
# What make test needs installed on the machine (scripts/test.sh runs this first), installed
# only through the system's package manager (apt-get, as root), after saying what, why and
# roughly how big. It installs packages and nothing else: no service is started, stopped or
# configured (installing starts none: a policy-rc.d forbids it for the install's duration,
# unless the machine has one of its own), no system database or user is touched. What the
# tests run (PostgreSQL, the RabbitMQ nodes, Jaeger) make test starts from folders of its own
# under .cache/ and stops at the end.
#
# Without root or apt-get it says exactly what is missing and what will not run without it,
# and the tests that need it skip, loudly (or fail under CI's SLUICE_REQUIRE_*=1). Quick when
# everything is there: it only looks.
set -uo pipefail

say() { echo "provision: $*"; }

# The packages, each with the commands that show it is installed, why make test needs it and
# roughly what it downloads on Debian 12 with its dependencies (apt-get's own figure follows).
pkgs=(rabbitmq-server postgresql prometheus chromium iptables debootstrap curl)
declare -A has=(
	[rabbitmq-server]="/usr/lib/rabbitmq/bin/rabbitmq-server"
	[postgresql]="/usr/lib/postgresql/*/bin/initdb"
	[prometheus]="prometheus promtool"
	[chromium]="chromium|chromium-browser"
	[iptables]="iptables"
	[debootstrap]="debootstrap"
	[curl]="curl"
)
declare -A why=(
	[rabbitmq-server]="RabbitMQ 3.10 (Debian 12's package): part 2's node and the nodes tests start; its system service stays stopped"
	[postgresql]="the outbox's SQL forwarder tests, on a PostgreSQL of make test's own (.cache/postgres)"
	[prometheus]="prometheus and promtool check the shipped alert rules and dashboard queries"
	[chromium]="the console's browser test (headless)"
	[iptables]="the fault suite's network partitions (rules of its own, removed after each test)"
	[debootstrap]="makes the Debian sid chroot RabbitMQ 4.3 runs from (part 1): about 400 MB more, once, cached in .cache/rabbitmq4"
	[curl]="Jaeger's health check (scripts/jaeger-start.sh)"
)
declare -A size=(
	[rabbitmq-server]=45 [postgresql]=20 [prometheus]=40 [chromium]=90 [iptables]=1 [debootstrap]=1 [curl]=1
)

present() {
	local alt c
	for alt in ${has[$1]}; do
		local ok=1
		for c in ${alt//|/ }; do
			# A path (a glob) or a command on PATH (or in /usr/sbin, off a user's PATH).
			if [[ "$c" == /* ]]; then
				compgen -G "$c" >/dev/null && {
					ok=0
					break
				}
			elif command -v "$c" >/dev/null 2>&1 || [ -x "/usr/sbin/$c" ]; then
				ok=0
				break
			fi
		done
		[ $ok = 0 ] || return 1
	done
	return 0
}

missing=()
for p in "${pkgs[@]}"; do
	present "$p" || missing+=("$p")
done
[ ${#missing[@]} = 0 ] && exit 0

total=0
say "make test needs these Debian packages, which are not installed:"
for p in "${missing[@]}"; do
	printf '  %-16s about %3d MB  %s\n' "$p" "${size[$p]}" "${why[$p]}"
	total=$((total + ${size[$p]}))
done

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	if [ "$(id -u)" != 0 ]; then reason="not root (running as $(id -un))"; else reason="no apt-get on this machine"; fi
	say "NOT INSTALLED ($reason): ${missing[*]}"
	say "install them with: sudo apt-get install ${missing[*]}"
	say "until then the tests that need them skip (fail in CI), and the run says which at its end"
	exit 0
fi

say "installing them with apt-get (about $total MB to download; no service is started)"
export DEBIAN_FRONTEND=noninteractive
begin=$SECONDS
if ! apt-get update -qq >/dev/null; then
	say "apt-get update failed; not installing ${missing[*]}: the tests that need them skip (fail in CI)"
	exit 0
fi
bytes=$(apt-get install --print-uris -qq "${missing[@]}" 2>/dev/null | awk '{s += $3} END {print s + 0}')
say "apt-get downloads $((bytes / 1000000)) MB for ${missing[*]} and their dependencies"
# Installing a daemon's package starts it on Debian; policy-rc.d (Debian's own switch for
# this) forbids it while apt-get runs. A machine's own policy-rc.d is left as it is.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\n# Written by sluice scripts/provision.sh for one apt-get install; removed after it.\nexit 101\n' >"$policy"
	chmod 755 "$policy"
	made_policy=1
	trap '[ $made_policy = 1 ] && rm -f "$policy"' EXIT
fi
if apt-get install -y -qq "${missing[@]}" >/dev/null; then
	say "installed ${missing[*]} in $((SECONDS - begin)) s"
else
	say "apt-get install ${missing[*]} failed; the tests that need them skip (fail in CI)"
fi
if [ $made_policy = 1 ]; then
	rm -f "$policy"
	made_policy=0
fi
exit 0
