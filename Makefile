# sluice — the two commands a fresh machine needs are `make run` and `make test`.
GO       ?= go
PKGS     ?= ./...
RABBITMQ ?=
BENCH_ROUNDS ?= 3
BENCH_BROKER ?= 4.3

.PHONY: screenshots run test test-go test-chaos test-faults test-cluster soak bench bench-record lint clean jaeger-start jaeger-stop cluster-start cluster-stop

## run: the payment demo (embedded broker unless AMQP_URL is set)
run:
	$(GO) run ./cmd/payments demo

## run-pubsub: the demo with the service subscribed to the exchange orders, successes on the exchange payments
run-pubsub:
	PAYMENTS_EXCHANGE=orders PAYMENTS_OUTPUT_EXCHANGE=payments $(GO) run ./cmd/payments demo

## test: every test, with the race detector, in two parts: on RabbitMQ 4.3 and on 3.10, each
## a node of its own, with a PostgreSQL and a Jaeger of its own, all started from .cache/ and
## stopped at the end; installs missing Debian packages first, saying what and why; ends with
## the time per part, the nodes' versions and the tests that skipped and why (scripts/test.sh).
## One package on one version: make test PKGS=./broker/amqp/ RABBITMQ=4.3 (or 3.10)
test:
	@GO="$(GO)" PKGS="$(PKGS)" SLUICE_TEST_RABBITMQ="$(RABBITMQ)" ./scripts/test.sh

## screenshots: refresh the docs' console pictures (docs/console-*.png) from the browser test
screenshots:
	SLUICE_SCREENSHOTS=$(CURDIR)/docs $(GO) test -count=1 -run 'TestBrowser$$' ./cmd/sluice/internal/console/

## test-chaos, test-faults, test-cluster: the chaos test (nodes it restarts), the network and
## broker fault suite, the three-node cluster tests, each alone, through make test (nodes of
## their own, started and stopped for them; both versions unless RABBITMQ=4.3 or 3.10)
test-chaos:
	@GO="$(GO)" PKGS=./test/chaos SLUICE_TEST_RABBITMQ="$(RABBITMQ)" ./scripts/test.sh

test-faults:
	@GO="$(GO)" PKGS=./test/faults SLUICE_TEST_RABBITMQ="$(RABBITMQ)" ./scripts/test.sh

test-cluster:
	@GO="$(GO)" PKGS=./test/cluster SLUICE_TEST_RABBITMQ="$(RABBITMQ)" ./scripts/test.sh

## soak: the payment service on RabbitMQ (AMQP_URL) at SOAK_RATE requests/s (default 100) for
## SOAK_DURATION (default 30m), 20% transient failures, 3% permanent, 5% duplicates; fails when
## memory, goroutines, connections or channels keep growing after the warm-up or a payment is
## not accounted for (test/soak); SOAK_RECORD=1 writes its table into BENCHMARKS.md's Soak section
SOAK_DURATION ?= 30m
SOAK_RATE     ?= 100
soak:
	SOAK_DURATION=$(SOAK_DURATION) SOAK_RATE=$(SOAK_RATE) $(GO) test -race -count=1 -v -timeout 0 -tags soak -run '^TestSoak$$' ./test/soak/

## bench: every benchmark, three rounds, on RabbitMQ 4.3 (BENCH_BROKER=3.10 for the machine's
## 3.10), then one table of sluice beside its reference (medians), headed by the broker's version
bench:
	@GO="$(GO)" PKGS="$(PKGS)" BENCH_ROUNDS="$(BENCH_ROUNDS)" BENCH_BROKER="$(BENCH_BROKER)" ./scripts/bench.sh

## bench-record: make bench, and the table replaces BENCHMARKS.md's generated table of that version
bench-record:
	@GO="$(GO)" PKGS="$(PKGS)" BENCH_ROUNDS="$(BENCH_ROUNDS)" BENCH_BROKER="$(BENCH_BROKER)" BENCH_RECORD=1 ./scripts/bench.sh

## lint: formatting, vet and golangci-lint (.golangci.yml) at the version pinned in
## tools/golangci-lint/go.mod, built once into .cache/bin
GOLANGCI_LINT := .cache/bin/golangci-lint
lint: $(GOLANGCI_LINT)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GOLANGCI_LINT) run $(PKGS)

$(GOLANGCI_LINT): tools/golangci-lint/go.mod tools/golangci-lint/go.sum
	cd tools/golangci-lint && $(GO) build -o $(CURDIR)/$(GOLANGCI_LINT) github.com/golangci/golangci-lint/v2/cmd/golangci-lint

## clean: build outputs, the local Jaeger and PostgreSQL, and every cache (the 4.3 chroot too)
clean:
	-./scripts/jaeger-stop.sh >/dev/null 2>&1
	-./scripts/postgres.sh stop >/dev/null 2>&1
	-./scripts/rabbitmq-cluster.sh stop >/dev/null 2>&1
	-./scripts/rabbitmq4.sh release >/dev/null 2>&1
	@if grep -q " $(CURDIR)/.cache/" /proc/self/mountinfo 2>/dev/null; then \
		echo "make clean: the RabbitMQ 4.3 chroot is still mounted (a node runs there: scripts/rabbitmq4.sh status); not removing .cache"; exit 1; fi
	rm -rf --one-file-system bin .cache
	$(GO) clean -testcache

jaeger-start:
	./scripts/jaeger-start.sh

jaeger-stop:
	./scripts/jaeger-stop.sh

## cluster-start / cluster-stop: the local three-node RabbitMQ cluster (127.0.0.1:5681-5683)
cluster-start:
	./scripts/rabbitmq-cluster.sh start

cluster-stop:
	./scripts/rabbitmq-cluster.sh stop
