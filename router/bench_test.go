package router_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/sony/gobreaker"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/benchkit/benchenv"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/otelstep"
	"github.com/sluice-go/sluice/internal/stackview"
	"github.com/sluice-go/sluice/internal/testkit/steptest"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
)

// Benchmarks of the whole stack, every message 1 KiB and persistent. Sub-benchmarks named
// sluice, raw and watermill under one parent are one comparison; internal/benchkit/benchtable
// (make bench) puts them side by side. The RabbitMQ ones need the local broker; their
// figures are comparable within one run only (the broker and the 2 cores are shared).
//
// "sluice" is always the full stack as a service runs it: telemetry (an OpenTelemetry SDK
// tracer that samples every span into a batch processor whose exporter discards them, and
// an SDK meter provider), recoverer, poison, retry, idempotency, breaker and timeout.

const (
	// benchConcurrency and benchPrefetch are the consumers' settings in every variant.
	benchConcurrency = 8
	benchPrefetch    = 64
	// benchDrainTimeout bounds one timed drain; only a broken run reaches it.
	benchDrainTimeout = 10 * time.Minute
)

var benchLogger = slog.New(slog.DiscardHandler)

// benchConsumeSluice is BenchmarkConsume's sluice variant with cfg.
func benchConsumeSluice(b *testing.B, url string, cfg router.Config) {
	r := testenv.NewRabbit(b)
	br := benchenv.Broker(b, url)
	q := benchenv.SluiceQueue(b, r, br, "bench.consume.sluice")
	benchPrefill(b, r, q, b.N)
	count := benchCountTo(b.N)
	if cfg.Guard == nil {
		cfg.Guard = benchGuard(b, idempotency.Config{})
	}
	stack := benchStack(b, br, cfg, true)
	if err := stack.Handle("bench", q, func(*message.Message) error {
		count.handled()
		return nil
	}, router.WithConcurrency(benchConcurrency), router.WithPrefetch(benchPrefetch)); err != nil {
		b.Fatal(err)
	}
	// The journal's cost is CPU on both sides of the connection (its stream appends and
	// its follower on the broker, the held acks here), so both are reported.
	cpu := newBenchCPU(url)
	cpu.guard = cfg.Guard
	b.ReportAllocs()
	b.ResetTimer()
	benchRunFrom(b, stack, count, func() { cpu.start(b) }, func(b *testing.B) {
		benchReportRate(b, count)
		cpu.report(b)
	})
}

// benchCPU measures the CPU the broker's process and this one use from start to report.
// With SLUICE_BENCH_CPUPROFILE set to a directory, it also writes this process's CPU
// profile of that span (the timed drain alone, not the prefill) into it, one file per
// benchmark run, for go tool pprof.
type benchCPU struct {
	broker     func() time.Duration
	cpu0, own0 time.Duration
	guard      *idempotency.Guard // when set, its journal's records per append are reported
	appended0  int64
	batches0   int64
	profile    *os.File
	allocs     string // the allocation profiles' path prefix: .allocs0 at start, .allocs1 at report
}

// writeAllocsProfile writes the allocation profile so far to path: the difference of two
// (go tool pprof -sample_index=alloc_objects -base a b) is what the span between allocated.
func writeAllocsProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}

func newBenchCPU(url string) *benchCPU { return &benchCPU{broker: benchenv.BrokerCPU(url)} }

func (c *benchCPU) start(b *testing.B) {
	if dir := os.Getenv("SLUICE_BENCH_CPUPROFILE"); dir != "" {
		name := strings.NewReplacer("/", "_", " ", "_").Replace(b.Name())
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.prof", name, b.N)))
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		c.profile = f
		c.allocs = strings.TrimSuffix(f.Name(), ".prof")
		writeAllocsProfile(b, c.allocs+".allocs0")
	}
	if c.guard != nil {
		st := c.guard.Stats().Journal
		c.appended0, c.batches0 = st.Appended, st.Batches
	}
	c.cpu0, c.own0 = c.broker(), benchenv.CPUTime()
}

// report reports both per 1,000 of b.N messages (and the journal's records per append).
func (c *benchCPU) report(b *testing.B) {
	brokerCPU, own := c.broker()-c.cpu0, benchenv.CPUTime()-c.own0
	if c.profile != nil {
		pprof.StopCPUProfile()
		_ = c.profile.Close()
		c.profile = nil
		writeAllocsProfile(b, c.allocs+".allocs1")
	}
	k := float64(b.N) / 1000
	b.ReportMetric(float64(brokerCPU.Microseconds())/1000/k, "broker-cpu-ms/kmsg")
	b.ReportMetric(float64(own.Microseconds())/1000/k, "cpu-ms/kmsg")
	if c.guard != nil {
		st := c.guard.Stats().Journal
		if n := st.Batches - c.batches0; n > 0 {
			b.ReportMetric(float64(st.Appended-c.appended0)/float64(n), "records/append")
		}
	}
}

// benchGuardWithoutJournal is an idempotency guard with its journal off, closed with b.
func benchGuardWithoutJournal(b *testing.B) *idempotency.Guard {
	return benchGuard(b, idempotency.Config{DisableJournal: true})
}

// benchGuard is an idempotency guard with cfg, logging nothing, closed with b.
func benchGuard(b *testing.B, cfg idempotency.Config) *idempotency.Guard {
	cfg.Logger = benchLogger
	guard, err := idempotency.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = guard.Close() })
	return guard
}

// BenchmarkConsume drains a queue pre-filled with b.N messages (outside the timer) through a
// handler that succeeds, with prefetch benchPrefetch and benchConcurrency messages at a
// time; msgs/s is the rate from the first message handled to the last (benchReportRate):
//   - sluice: router.New on the RabbitMQ broker, the full stack, WithConcurrency and
//     WithPrefetch, the idempotency journal on (the default);
//   - sluice-nojournal: the same with the journal off (idempotency.Config.DisableJournal),
//     so the two side by side, beside the references of the same round, are its cost;
//   - raw: amqp091-go, one channel, benchConcurrency goroutines receiving and acking;
//   - watermill: watermill-amqp's subscriber (NewDurableQueueConfig) under a plain
//     Watermill router. Its subscriber hands out one message at a time per subscription,
//     so the router gets benchConcurrency handlers on the queue, each with prefetch
//     benchPrefetch/benchConcurrency: the same concurrency and total prefetch.
func BenchmarkConsume(b *testing.B) {
	url := testenv.AMQPURL(b)
	b.Run("sluice", func(b *testing.B) { benchConsumeSluice(b, url, router.Config{}) })
	b.Run("sluice-nojournal", func(b *testing.B) {
		benchConsumeSluice(b, url, router.Config{Guard: benchGuardWithoutJournal(b)})
	})
	b.Run("raw", func(b *testing.B) {
		r := testenv.NewRabbit(b)
		q := benchenv.PlainQueue(b, r, "bench.consume.raw")
		benchPrefill(b, r, q, b.N)
		count := benchCountTo(b.N)
		ch := benchConsumerChannel(b, r)
		cpu := newBenchCPU(url)
		b.ReportAllocs()
		b.ResetTimer()
		cpu.start(b)
		deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		for range benchConcurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for d := range deliveries {
					if err := d.Ack(false); err != nil {
						b.Error(err)
						return
					}
					count.handled()
				}
			}()
		}
		benchWait(b, count.done)
		b.StopTimer()
		benchReportRate(b, count)
		cpu.report(b)
		_ = ch.Close()
		wg.Wait()
	})
	b.Run("watermill", func(b *testing.B) {
		r := testenv.NewRabbit(b)
		q := benchenv.PlainQueue(b, r, "bench.consume.watermill")
		benchPrefill(b, r, q, b.N)
		count := benchCountTo(b.N)
		cfg := wamqp.NewDurableQueueConfig(url)
		cfg.Consume.Qos.PrefetchCount = benchPrefetch / benchConcurrency
		sub, err := wamqp.NewSubscriber(cfg, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		wr, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		for i := range benchConcurrency {
			wr.AddNoPublisherHandler(fmt.Sprintf("bench-%d", i), q, sub, func(*message.Message) error {
				count.handled()
				return nil
			})
		}
		cpu := newBenchCPU(url)
		b.ReportAllocs()
		b.ResetTimer()
		cpu.start(b)
		ctx, cancel := context.WithCancel(context.Background())
		stopped := make(chan error, 1)
		go func() { stopped <- wr.Run(ctx) }()
		benchWait(b, count.done)
		b.StopTimer()
		benchReportRate(b, count)
		cpu.report(b)
		_ = wr.Close()
		cancel()
		<-stopped
		_ = sub.Close()
	})
}

// BenchmarkRetryPath drains b.N pre-filled messages of which every one fails once: the
// failed attempt is handed to the delay cascade with delay 0 (confirmed), acked, consumed
// again and succeeds. Timed until b.N messages succeeded.
//   - sluice: the full stack; retry with a 1ns backoff (0 cascade units), so the hand-off
//     is Broker.Delay(0) through the cascade's exchanges back into the queue;
//   - raw: amqp091-go through the same cascade, pipelined: one consumer (prefetch
//     benchPrefetch) publishes a first attempt's copy with x-retry-count to the cascade on
//     a confirm channel and acks the original once that copy is confirmed, acks a second
//     attempt. It takes the cheapest correct route for a delay of 0: it enters the cascade
//     at its lowest level (every topic-exchange hop costs the broker). Up to benchPrefetch
//     hand-offs are in flight, so sluice runs with benchPrefetch handlers to have as many;
//   - raw-record: raw, each copy also carrying the failure record sluice writes (six
//     headers and a traceparent, about 330 bytes). The broker's work grows with those
//     bytes, so this is the cost of the record itself, apart from sluice's code; the
//     target is measured against raw;
//   - sluice-nojournal: sluice with the idempotency journal off (the raw loops journal
//     nothing);
//   - sluice-untraced: sluice without telemetry (the journal on). Every message makes three
//     spans here (two attempts and the hand-off) and the raw loops none, so this row
//     separates what tracing costs on this path from what the rest of the stack costs.
func BenchmarkRetryPath(b *testing.B) {
	url := testenv.AMQPURL(b)
	sluiceRun := func(b *testing.B, guard *idempotency.Guard, traced bool) {
		r := testenv.NewRabbit(b)
		br := benchenv.Broker(b, url)
		if guard == nil {
			guard = benchGuard(b, idempotency.Config{})
		}
		stack, count := benchRetryLoad(b, r, br, "bench.retry.sluice", b.N, nil, guard, traced)
		cpu := newBenchCPU(url)
		cpu.guard = guard
		b.ReportAllocs()
		b.ResetTimer()
		// Over the whole run, not from the first success: every first attempt is queued
		// ahead of every retried copy, so the first success comes half-way through.
		benchRunFrom(b, stack, count, func() { cpu.start(b) }, func(b *testing.B) {
			benchenv.ReportRate(b)
			cpu.report(b)
		})
	}
	b.Run("sluice", func(b *testing.B) { sluiceRun(b, nil, true) })
	b.Run("sluice-nojournal", func(b *testing.B) { sluiceRun(b, benchGuardWithoutJournal(b), true) })
	b.Run("sluice-untraced", func(b *testing.B) { sluiceRun(b, nil, false) })
	b.Run("raw", func(b *testing.B) { benchRawRetry(b, url, "bench.retry.raw", false) })
	b.Run("raw-record", func(b *testing.B) { benchRawRetry(b, url, "bench.retry.rawrecord", true) })
}

// benchRawRetry is BenchmarkRetryPath's raw loop. With record, each retry copy also carries
// the failure record sluice's retry step and tracing write (benchFailureRecord), so that
// sluice can be compared with a loop that sends the broker the same bytes.
func benchRawRetry(b *testing.B, url, prefix string, record bool) {
	r := testenv.NewRabbit(b)
	br := benchenv.Broker(b, url)
	q := benchenv.SluiceQueue(b, r, br, prefix)
	benchPrefill(b, r, q, b.N)
	count := benchCountTo(b.N)
	in := benchConsumerChannel(b, r)
	out, err := r.Conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := out.Confirm(false); err != nil {
		b.Fatal(err)
	}
	// A delay of 0 sets no digit, so the cheapest correct route into the cascade is its
	// lowest digit's exchange, which passes the message to the delivery exchange.
	exchange := topology.DelayDigit(0)
	key := benchDelayKey(0, q)
	var rec message.Metadata
	if record {
		rec = benchFailureRecord(b, q)
	}
	type step struct {
		d  amqp091.Delivery
		dc *amqp091.DeferredConfirmation // nil: the second attempt, just ack
	}
	steps := make(chan step, benchPrefetch)
	cpu := newBenchCPU(url)
	b.ReportAllocs()
	b.ResetTimer()
	cpu.start(b)
	deliveries, err := in.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		defer close(steps)
		for d := range deliveries {
			if _, retried := d.Headers[sluice.HeaderRetryCount]; retried {
				steps <- step{d: d}
				continue
			}
			headers := make(amqp091.Table, len(d.Headers)+1)
			for k, v := range d.Headers {
				headers[k] = v
			}
			headers[sluice.HeaderRetryCount] = "1"
			for k, v := range rec {
				headers[k] = v
			}
			dc, err := out.PublishWithDeferredConfirmWithContext(context.Background(), exchange, key, true, false, amqp091.Publishing{
				Headers: headers, MessageId: d.MessageId, DeliveryMode: amqp091.Persistent, Body: d.Body,
			})
			if err != nil {
				b.Error(err)
				return
			}
			steps <- step{d: d, dc: dc}
		}
	}()
	acked := make(chan struct{})
	go func() {
		defer close(acked)
		for s := range steps {
			if s.dc != nil && !s.dc.Wait() {
				b.Error("hand-off nacked")
				return
			}
			if err := s.d.Ack(false); err != nil {
				b.Error(err)
				return
			}
			if s.dc == nil {
				count.handled()
			}
		}
	}()
	benchWait(b, count.done)
	b.StopTimer()
	benchenv.ReportRate(b)
	cpu.report(b)
	_ = in.Close()
	<-acked
	_ = out.Close()
}

// BenchmarkStackInProcess is the in-process cost per message of the failure-handling
// stack on the success path, the broker bypassed: the composed handler is called directly.
//   - sluice: router's composition (recoverer, retry with its poison step, idempotency keyed by message
//     id, breaker, timeout, handler-panic recoverer), without telemetry;
//   - watermill: Watermill's own middleware stacked the same way: Recoverer, PoisonQueue,
//     Retry, Deduplicator (keyed by message id, in-memory), CircuitBreaker, Timeout.
//
// Messages are made in batches with the timer stopped, so only the stack is measured.
func BenchmarkStackInProcess(b *testing.B) {
	handler := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	b.Run("sluice", func(b *testing.B) {
		stack := benchStack(b, benchMemoryBroker(b), router.Config{}, false)
		benchInProcess(b, stack.ComposeForBenchmark("bench", handler))
	})
	b.Run("watermill", func(b *testing.B) {
		poisonMW, err := wmiddleware.PoisonQueue(benchNopPublisher{}, "bench.poison")
		if err != nil {
			b.Fatal(err)
		}
		repo, err := wmiddleware.NewMapExpiringKeyRepository(24 * time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		dedup := &wmiddleware.Deduplicator{
			KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil },
			Repository: repo,
		}
		h := wmiddleware.Timeout(30 * time.Second)(handler)
		h = wmiddleware.NewCircuitBreaker(gobreaker.Settings{Name: "bench"}).Middleware(h)
		h = dedup.Middleware(h)
		h = wmiddleware.Retry{MaxRetries: 5, InitialInterval: time.Second, Multiplier: 2, MaxInterval: time.Minute}.Middleware(h)
		h = poisonMW(h)
		h = wmiddleware.Recoverer(h)
		benchInProcess(b, h)
	})
}

// BenchmarkStackInProcessTraced is BenchmarkStackInProcess's sluice stack with telemetry:
// a span and the metrics per message, what the tracing step adds.
func BenchmarkStackInProcessTraced(b *testing.B) {
	b.Run("sluice", func(b *testing.B) {
		stack := benchStack(b, benchMemoryBroker(b), router.Config{}, true)
		benchInProcess(b, stack.ComposeForBenchmark("bench", func(*message.Message) ([]*message.Message, error) { return nil, nil }))
	})
}

func benchInProcess(b *testing.B, h message.HandlerFunc) {
	const batch = 1024
	msgs := make([]*message.Message, 0, batch)
	id := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if len(msgs) == 0 {
			b.StopTimer()
			for range min(batch, b.N-i) {
				id++
				msgs = append(msgs, message.NewMessage("m-"+strconv.Itoa(id), benchenv.Payload))
			}
			b.StartTimer()
		}
		m := msgs[len(msgs)-1]
		msgs = msgs[:len(msgs)-1]
		if _, err := h(m); err != nil {
			b.Fatal(err)
		}
	}
}

// benchStack builds the full stack on broker: cfg plus breakers, idempotency and, when
// traced, telemetry.
func benchStack(b *testing.B, broker router.Broker, cfg router.Config, traced bool) *router.Stack {
	b.Helper()
	cfg.Logger = benchLogger
	if traced {
		cfg.Telemetry = benchTelemetry(b)
	}
	if cfg.Breakers == nil {
		reg, err := breaker.New(breaker.Config{Logger: benchLogger})
		if err != nil {
			b.Fatal(err)
		}
		cfg.Breakers = reg
	}
	if cfg.Guard == nil {
		guard, err := idempotency.New(idempotency.Config{Logger: benchLogger})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = guard.Close() })
		cfg.Guard = guard
	}
	s, err := router.New(broker, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// benchRetryLoad returns a stack (not running) whose handler fails each of n messages
// pre-filled in queue name once (BenchmarkRetryPath's), and its success counter; first,
// when not nil, counts the failed first attempts; guard, when not nil, is the stack's
// idempotency step; traced runs it with telemetry.
func benchRetryLoad(b *testing.B, r *testenv.Rabbit, br *amqp.Broker, name string, n int, first *atomic.Int64, guard *idempotency.Guard, traced bool) (*router.Stack, *benchCounter) {
	b.Helper()
	q := benchenv.SluiceQueue(b, r, br, name)
	benchPrefill(b, r, q, n)
	count := benchCountTo(n)
	// Every first attempt fails, so a breaker with default settings would rightly open
	// and defer everything; this one is on the path but never trips.
	reg, err := breaker.New(breaker.Config{ConsecutiveFailures: math.MaxUint32, Logger: benchLogger})
	if err != nil {
		b.Fatal(err)
	}
	cfg := router.Config{
		Retry: retry.Config{
			InitialDelay: time.Nanosecond, MaxDelay: time.Nanosecond, Multiplier: 1, Jitter: retry.NoJitter,
		},
		Breakers: reg,
	}
	if guard != nil {
		cfg.Guard = guard
	}
	stack := benchStack(b, br, cfg, traced)
	errOnce := errors.New("fails once")
	if err := stack.Handle("bench", q, func(m *message.Message) error {
		if sluice.RetryCount(m.Metadata) == 0 {
			if first != nil {
				first.Add(1)
			}
			return errOnce
		}
		count.handled()
		return nil
	}, router.WithConcurrency(benchPrefetch), router.WithPrefetch(benchPrefetch)); err != nil {
		b.Fatal(err)
	}
	return stack, count
}

// benchTelemetry is telemetry as a service runs it, minus the network: every span sampled
// and batched, then discarded; metrics recorded by an SDK meter provider.
func benchTelemetry(b *testing.B) *telemetry.Config {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(benchDiscardExporter{}))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return &telemetry.Config{TracerProvider: tp, MeterProvider: mp, Propagator: propagation.TraceContext{}}
}

type benchDiscardExporter struct{}

func (benchDiscardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (benchDiscardExporter) Shutdown(context.Context) error                             { return nil }

type benchNopPublisher struct{}

func (benchNopPublisher) Publish(string, ...*message.Message) error { return nil }
func (benchNopPublisher) Close() error                              { return nil }

func benchMemoryBroker(b *testing.B) *memory.Broker {
	mb := memory.New(memory.Config{Logger: benchLogger})
	b.Cleanup(func() { _ = mb.Close() })
	return mb
}

// benchRun runs stack until done, timing it, and closes it outside the timer.
func benchRun(b *testing.B, stack *router.Stack, count *benchCounter, report func(*testing.B)) {
	b.Helper()
	benchRunFrom(b, stack, count, func() {}, report)
}

// benchRunFrom is benchRun that calls started once the stack consumes, as the timer starts.
func benchRunFrom(b *testing.B, stack *router.Stack, count *benchCounter, started func(), report func(*testing.B)) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	// Start-up is not the measured work: on RabbitMQ 3.x a new journal stream alone takes
	// half a second (broker/amqp's journalStreamSettle), so a first round of b.N = 1 took
	// over the benchmark time and the framework never grew b.N.
	b.StopTimer()
	go func() { stopped <- stack.Run(ctx) }()
	benchStarted(b, stack, stopped)
	started()
	b.StartTimer()
	benchWait(b, count.done)
	b.StopTimer()
	report(b)
	_ = stack.Close()
	cancel()
	if err := <-stopped; err != nil && !errors.Is(err, context.Canceled) {
		b.Error(err)
	}
}

// benchStarted waits until stack consumes and its idempotency journals, if any, are
// restored; stopped is Run's result, a failure to start.
func benchStarted(b *testing.B, stack *router.Stack, stopped <-chan error) {
	b.Helper()
	select {
	case <-stack.Running():
	case err := <-stopped:
		b.Fatalf("stack stopped at start: %v", err)
	case <-time.After(time.Minute):
		b.Fatal("stack did not start within a minute")
	}
	journaled := false
	for _, h := range stack.Describe().Handlers {
		journaled = journaled || h.Idempotency != nil && h.Idempotency.Journal != ""
	}
	for deadline := time.Now().Add(time.Minute); journaled; time.Sleep(time.Millisecond) {
		if st, ok := benchJournalState(stack); !ok || st.Restoring == 0 && st.RestoreDuration > 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatal("the idempotency journals did not restore within a minute")
		}
	}
}

// benchJournalState is the stack's idempotency journal figures.
func benchJournalState(s *router.Stack) (otelstep.JournalState, bool) {
	v, _ := stackview.Of(s)
	return v.Journal()
}

// benchCounter counts handled messages and when the first and the last were handled.
type benchCounter struct {
	n           int64
	count       atomic.Int64
	first, last atomic.Int64 // UnixNano
	done        chan struct{}
}

// benchCountTo returns a counter whose done channel closes when handled was called n times.
func benchCountTo(n int) *benchCounter {
	return &benchCounter{n: int64(n), done: make(chan struct{})}
}

func (c *benchCounter) handled() {
	now := time.Now().UnixNano()
	c.first.CompareAndSwap(0, now)
	if c.count.Add(1) == c.n {
		c.last.Store(now)
		close(c.done)
	}
}

func benchWait(b *testing.B, done <-chan struct{}) {
	b.Helper()
	select {
	case <-done:
	case <-time.After(benchDrainTimeout):
		b.Fatalf("not all %d messages handled within %s", b.N, benchDrainTimeout)
	}
}

// benchReportRate reports msgs/s from the first message handled to the last: the rate of
// the drain itself, without the time a consumer takes to start (open a channel, consume,
// start a router), which would weigh on a short run and differs between variants.
func benchReportRate(b *testing.B, c *benchCounter) {
	if span := time.Duration(c.last.Load() - c.first.Load()); c.n > 1 && span > 0 {
		b.ReportMetric(float64(c.n-1)/span.Seconds(), "msgs/s")
		return
	}
	benchenv.ReportRate(b)
}

// benchPrefill publishes n 1 KiB persistent messages to queue with a raw pipelined publisher,
// each with a unique id in the message-id property and Watermill's uuid header, and waits
// for every confirm.
func benchPrefill(b *testing.B, r *testenv.Rabbit, queue string, n int) {
	b.Helper()
	ch, err := r.Conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	prefix := watermill.NewShortUUID() + "-"
	nacked := benchenv.PublishPipelined(b, ch, queue, n, 1024, func(i int) amqp091.Publishing {
		id := prefix + strconv.Itoa(i)
		return amqp091.Publishing{
			Headers:      amqp091.Table{headers.UUID: id},
			MessageId:    id,
			DeliveryMode: amqp091.Persistent,
			Body:         benchenv.Payload,
		}
	})
	if nacked > 0 {
		b.Fatalf("benchPrefill %s: %d of %d publishes nacked", queue, nacked, n)
	}
}

// benchConsumerChannel opens a channel on r with the consumers' prefetch, benchPrefetch.
func benchConsumerChannel(b *testing.B, r *testenv.Rabbit) *amqp091.Channel {
	b.Helper()
	ch, err := r.Conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Qos(benchPrefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	return ch
}

// benchFailureRecord returns the headers sluice's retry step and tracing write on the copy of
// a first attempt that failed in queue, taken from those steps themselves: the retry step,
// its delayer traced, run once on a message whose handler fails as the benchmark's does.
func benchFailureRecord(b *testing.B, queue string) message.Metadata {
	b.Helper()
	var copied message.Metadata
	in, err := otelstep.New(otelstep.Config(*benchTelemetry(b)))
	if err != nil {
		b.Fatal(err)
	}
	capture := in.WrapDelayer(steptest.DelayerFunc(func(_ context.Context, _ string, _ time.Duration, msg *message.Message) error {
		copied = msg.Metadata
		return nil
	}))
	r, err := retry.New(retry.Config{Delayer: capture, DeadLetterer: noDeadLetter{}, Logger: benchLogger})
	if err != nil {
		b.Fatal(err)
	}
	fail := func(*message.Message) ([]*message.Message, error) { return nil, errors.New("fails once") }
	steptest.Run(b, r.Middleware, fail, steptest.Message{Queue: queue, Handler: "bench", Payload: benchenv.Payload})
	if copied.Get(sluice.HeaderRetryHistory) == "" || copied.Get(headers.TraceParent) == "" {
		b.Fatalf("benchFailureRecord: the retry step handed off no record: %v", copied)
	}
	return copied
}

// benchDelayKey is the delay cascade's routing key for a delay of units to queue: the
// units' DelayLevels binary digits, highest first, then queue (the key format the base-16
// cascade's digit exchanges route on). A delay of 0 only passes the digits' exchanges.
func benchDelayKey(units uint64, queue string) string {
	key := make([]byte, 0, 2*amqp.DelayLevels+len(queue))
	for k := amqp.DelayLevels - 1; k >= 0; k-- {
		if units&(1<<k) != 0 {
			key = append(key, '1', '.')
		} else {
			key = append(key, '0', '.')
		}
	}
	return string(append(key, queue...))
}

// noDeadLetter is the dead-letter publish of a benchmark whose messages are never
// dead-lettered: it fails, so one that were would be noticed.
type noDeadLetter struct{}

func (noDeadLetter) DeadLetter(context.Context, string, *message.Message) error {
	return errors.New("benchmark: unexpected dead letter")
}
