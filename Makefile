# sluice — the two commands a fresh machine needs are `make run` and `make test`.
GO       ?= go
PKGS     ?= ./...
BENCH_ROUNDS ?= 3
BENCH_BROKER ?= 4.3

.PHONY: screenshots run test test-go test-chaos test-faults test-cluster soak bench bench-record lint clean jaeger-start jaeger-stop cluster-start cluster-stop

## run: the payment demo (embedded broker unless AMQP_URL is set)
run:
	$(GO) run ./cmd/payments demo

## run-pubsub: the demo with the service subscribed to the exchange orders, successes on the exchange payments
run-pubsub:
	PAYMENTS_EXCHANGE=orders PAYMENTS_OUTPUT_EXCHANGE=payments $(GO) run ./cmd/payments demo

## test: every test, with the race detector, against RabbitMQ (started here when installed) and
## a Jaeger started here; ends with a list of the tests that skipped and why (scripts/test.sh)
test:
	@GO="$(GO)" PKGS="$(PKGS)" ./scripts/test.sh

## screenshots: refresh the docs' console pictures (docs/console-*.png) from the browser test
screenshots:
	SLUICE_SCREENSHOTS=$(CURDIR)/docs $(GO) test -count=1 -run 'TestBrowser$$' ./cmd/sluice/internal/console/

## test-chaos: the chaos test alone (restarts RabbitMQ; never beside other broker tests)
test-chaos:
	$(GO) test -race -count=1 -timeout 15m -tags chaos -run Chaos ./test/chaos/

## test-faults: the network and broker fault suite alone (nodes of its own; never beside other broker tests)
test-faults:
	$(GO) test -race -count=1 -timeout 15m -tags faults -v ./test/faults/

## test-cluster: the three-node cluster tests alone (test/cluster starts and stops the cluster)
test-cluster:
	$(GO) test -race -count=1 -timeout 10m -v ./test/cluster/

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

## clean: build outputs and the local Jaeger
clean:
	-./scripts/jaeger-stop.sh >/dev/null 2>&1
	-./scripts/rabbitmq-cluster.sh stop >/dev/null 2>&1
	rm -rf bin .cache
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
