#!/usr/bin/env bash
# What make test needs on the machine, installed and started here (scripts/test.sh runs this
# first): on Debian as root, the missing packages (RabbitMQ, PostgreSQL, Prometheus and
# promtool, Chromium, iptables, debootstrap) with apt-get, and PostgreSQL with the test
# database the outbox tests use (trust authentication on 127.0.0.1, database "test").
# RabbitMQ itself is started by scripts/test.sh, RabbitMQ 4.3 by scripts/rabbitmq4.sh and
# Jaeger by scripts/jaeger-start.sh. Without root or apt-get it says what to install, and
# the tests that need what is missing skip loudly (or fail under SLUICE_REQUIRE_*=1).
# Quick when everything is there: it only looks.
set -uo pipefail

say() { echo "provision: $*"; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# command -> Debian package
declare -A need=(
	[rabbitmq-server]=rabbitmq-server
	[pg_ctlcluster]=postgresql
	[prometheus]=prometheus
	[promtool]=prometheus
	[chromium]=chromium
	[iptables]=iptables
	[debootstrap]=debootstrap
)
missing=()
for cmd in "${!need[@]}"; do
	command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("${need[$cmd]}")
done
# shellcheck disable=SC2207 # package names have no spaces
missing=($(printf '%s\n' "${missing[@]}" | sort -u))
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		say "installing ${missing[*]}"
		begin=$SECONDS
		export DEBIAN_FRONTEND=noninteractive
		if apt-get update -qq >/dev/null && apt-get install -y -qq "${missing[@]}" >/dev/null; then
			say "installed in $((SECONDS - begin)) s"
		else
			say "apt-get install ${missing[*]} failed; the tests that need them will skip (or fail in CI)"
		fi
	else
		say "missing: ${missing[*]} (install them with apt-get as root); the tests that need them will skip (or fail in CI)"
	fi
fi

# PostgreSQL for the outbox's SQL forwarder tests (testenv.PostgresURL).
if ! port_open 5432 && command -v pg_ctlcluster >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
	pg_version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -1)
	if [ -n "$pg_version" ]; then
		pg_hba=/etc/postgresql/$pg_version/main/pg_hba.conf
		grep -q '^host all all 127.0.0.1/32 trust' "$pg_hba" || sed -i '1i host all all 127.0.0.1/32 trust' "$pg_hba"
		say "starting PostgreSQL $pg_version"
		pg_ctlcluster --skip-systemctl-redirect "$pg_version" main start >/dev/null 2>&1 || true
		for _ in $(seq 1 60); do port_open 5432 && break; sleep 1; done
	fi
fi
if port_open 5432 && [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1; then
	su postgres -c "psql -tAc \"SELECT 1 FROM pg_database WHERE datname='test'\"" 2>/dev/null | grep -q 1 ||
		su postgres -c "createdb test" >/dev/null 2>&1 || say "could not create the database test"
fi
exit 0
