# sluice — the two commands a fresh machine needs are `make run` and `make test`.
GO       ?= go
PKGS     ?= ./...
BENCH_ROUNDS ?= 3

.PHONY: run test test-go test-chaos test-faults test-cluster bench lint clean jaeger-start jaeger-stop cluster-start cluster-stop

## run: the payment demo (embedded broker unless AMQP_URL is set)
run:
	$(GO) run ./cmd/payments demo

## test: every test, with the race detector, against RabbitMQ and a Jaeger started here
test:
	@./scripts/jaeger-start.sh || { [ "$${SLUICE_REQUIRE_JAEGER:-0}" != 1 ] && echo "make: Jaeger not started; its tests will skip"; }
	@status=0; \
	$(GO) test -race -count=1 -timeout 20m $(PKGS) || status=$$?; \
	if [ $$status = 0 ]; then $(MAKE) --no-print-directory test-chaos || status=$$?; fi; \
	if [ $$status = 0 ]; then $(MAKE) --no-print-directory test-faults || status=$$?; fi; \
	./scripts/jaeger-stop.sh >/dev/null 2>&1 || true; \
	exit $$status

## test-chaos: the chaos test alone (restarts RabbitMQ; never beside other broker tests)
test-chaos:
	$(GO) test -race -count=1 -timeout 15m -tags chaos -run Chaos ./test/chaos/

## test-faults: the network and broker fault suite alone (nodes of its own; never beside other broker tests)
test-faults:
	$(GO) test -race -count=1 -timeout 12m -tags faults -v ./test/faults/

## test-cluster: the three-node cluster tests alone (test/cluster starts and stops the cluster)
test-cluster:
	$(GO) test -race -count=1 -timeout 10m -v ./test/cluster/

## bench: every benchmark, three rounds, then one table of sluice beside its reference (medians)
bench:
	$(GO) run ./internal/benchtable -rounds $(BENCH_ROUNDS) -- $(GO) test -p 1 -run '^$$' -bench . -benchmem -count=1 -timeout 30m $(PKGS)

## lint: formatting and vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

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
