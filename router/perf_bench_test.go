package router_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/benchkit/benchenv"
	"github.com/sluice-go/sluice/internal/benchkit/delaybench"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
)

// Benchmarks of issue 27 (performance): a slow handler, the cost of tracing, the delay
// cascade under load and how the stack's cost grows. What each compares is in BENCHMARKS.md.

// slowHandlerWait is the slow handler's wait: a database call.
const slowHandlerWait = 2 * time.Millisecond

// BenchmarkSlowHandler8 and BenchmarkSlowHandler32 drain a pre-filled queue through a
// handler that waits slowHandlerWait, at concurrency 8 and 32:
//   - sluice: the full stack, WithConcurrency(c), WithPrefetch(2c);
//   - sluice-nojournal: the same with the idempotency journal off, beside it the journal's
//     cost with a handler that waits as a database call does;
//   - raw: amqp091-go, one channel with prefetch 2c, c goroutines each waiting and acking:
//     what the broker and the client allow on this machine, the ceiling sluice is held to;
//   - watermill: watermill-amqp's subscriber under a plain Watermill router. It hands out
//     one message at a time per subscription, so the router gets c handlers on the queue,
//     each with prefetch 2: the same concurrency and total prefetch;
//   - sleep: no broker, c goroutines that only sleep slowHandlerWait b.N times between
//     them. time.Sleep overshoots (on Linux a 2 ms sleep lasts 2.6–2.9 ms on a busy
//     machine), so this, not c / slowHandlerWait, is the practical ideal.
//
// msgs/s is the drain rate from the first message handled to the last; of-ideal is that
// rate over the ideal c / slowHandlerWait.
func BenchmarkSlowHandler8(b *testing.B)  { benchSlowHandler(b, 8) }
func BenchmarkSlowHandler32(b *testing.B) { benchSlowHandler(b, 32) }

// benchSlowHandlerSluice is benchSlowHandler's sluice variant at concurrency c with cfg.
func benchSlowHandlerSluice(b *testing.B, url string, c int, cfg router.Config, report func(*testing.B, *benchCounter)) {
	r := testenv.NewRabbit(b)
	br := benchenv.Broker(b, url)
	q := benchenv.SluiceQueue(b, r, br, fmt.Sprintf("bench.slow%d.sluice", c))
	benchPrefill(b, r, q, b.N)
	count := benchCountTo(b.N)
	if cfg.Guard == nil {
		cfg.Guard = benchGuard(b, idempotency.Config{})
	}
	stack := benchStack(b, br, cfg, true)
	if err := stack.Handle("bench", q, func(*message.Message) error {
		time.Sleep(slowHandlerWait)
		count.handled()
		return nil
	}, router.WithConcurrency(c), router.WithPrefetch(2*c)); err != nil {
		b.Fatal(err)
	}
	cpu := newBenchCPU(url)
	cpu.guard = cfg.Guard
	b.ReportAllocs()
	b.ResetTimer()
	benchRunFrom(b, stack, count, func() { cpu.start(b) }, func(b *testing.B) {
		report(b, count)
		cpu.report(b)
	})
}

// slowHandlerReport reports a drain's rate and its share of the ideal at concurrency c.
func slowHandlerReport(c int) func(*testing.B, *benchCounter) {
	ideal := float64(c) / slowHandlerWait.Seconds()
	return func(b *testing.B, count *benchCounter) {
		benchReportRate(b, count)
		if span := time.Duration(count.last.Load() - count.first.Load()); count.n > 1 && span > 0 {
			b.ReportMetric(float64(count.n-1)/span.Seconds()/ideal, "of-ideal")
		}
	}
}

func benchSlowHandler(b *testing.B, c int) {
	url := testenv.AMQPURL(b)
	report := slowHandlerReport(c)
	b.Run("sluice", func(b *testing.B) { benchSlowHandlerSluice(b, url, c, router.Config{}, report) })
	b.Run("sluice-nojournal", func(b *testing.B) {
		benchSlowHandlerSluice(b, url, c, router.Config{Guard: benchGuardWithoutJournal(b)}, report)
	})
	b.Run("raw", func(b *testing.B) {
		r := testenv.NewRabbit(b)
		q := benchenv.PlainQueue(b, r, fmt.Sprintf("bench.slow%d.raw", c))
		benchPrefill(b, r, q, b.N)
		count := benchCountTo(b.N)
		ch, err := r.Conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if err := ch.Qos(2*c, 0, false); err != nil {
			b.Fatal(err)
		}
		cpu := newBenchCPU(url)
		b.ReportAllocs()
		b.ResetTimer()
		cpu.start(b)
		deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		for range c {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for d := range deliveries {
					time.Sleep(slowHandlerWait)
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
		report(b, count)
		cpu.report(b)
		_ = ch.Close()
		wg.Wait()
	})
	b.Run("sleep", func(b *testing.B) {
		count := benchCountTo(b.N)
		var tickets atomic.Int64
		b.ResetTimer()
		var wg sync.WaitGroup
		for range c {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for tickets.Add(1) <= int64(b.N) {
					time.Sleep(slowHandlerWait)
					count.handled()
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		report(b, count)
	})
	b.Run("watermill", func(b *testing.B) {
		r := testenv.NewRabbit(b)
		q := benchenv.PlainQueue(b, r, fmt.Sprintf("bench.slow%d.watermill", c))
		benchPrefill(b, r, q, b.N)
		count := benchCountTo(b.N)
		cfg := wamqp.NewDurableQueueConfig(url)
		cfg.Consume.Qos.PrefetchCount = 2
		sub, err := wamqp.NewSubscriber(cfg, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		wr, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		for i := range c {
			wr.AddNoPublisherHandler(fmt.Sprintf("bench-%d", i), q, sub, func(*message.Message) error {
				time.Sleep(slowHandlerWait)
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
		report(b, count)
		cpu.report(b)
		_ = wr.Close()
		cancel()
		<-stopped
		_ = sub.Close()
	})
}

// BenchmarkTracingOverhead is the in-process stack of BenchmarkStackInProcess traced,
// against the same stack untraced in the same run: batches of 1024 messages go through
// each in turn, so a busy minute on the shared machine slows both alike. x-untraced is
// traced time over untraced time (the target is at most 2). Sub-benchmarks are the
// OpenTelemetry SDK as a user may run it, with a batch span processor and an SDK meter
// provider (default exemplar filter, trace_based), unless the name says otherwise:
//   - always: every span sampled (the SDK's default sampler, ParentBased(AlwaysSample));
//   - ratio10: ParentBased(TraceIDRatioBased(0.1)), one trace in ten;
//   - metrics: no tracer provider (a no-op tracer), metrics only;
//   - always-noexemplar, ratio10-noexemplar: exemplar.AlwaysOffFilter
//     (OTEL_METRICS_EXEMPLAR_FILTER=always_off);
//   - always-simple: a simple span processor (the exporter called on every span's End;
//     with this discard exporter, no hand-off to the batch processor's goroutine).
//
// The sdk-* variants are not sluice's telemetry but the SDK's floor beside the same
// untraced stack, a step outside it doing only what the SDK must for what sluice emits:
//   - sdk-span: a bare tracer.Start and span.End, always sampled, batch processor;
//   - sdk-floor: that span with the consumer span's nine attributes on success (four at start, five
//     set before End) and the two duration histograms recorded in its context.
func BenchmarkTracingOverhead(b *testing.B) {
	type variant struct {
		name       string
		sampler    sdktrace.Sampler // nil: no tracer provider
		noExemplar bool
		simple     bool
		floor      func(tp *sdktrace.TracerProvider, mp *sdkmetric.MeterProvider) message.HandlerMiddleware // nil: sluice's telemetry
	}
	always, ratio10 := sdktrace.ParentBased(sdktrace.AlwaysSample()), sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.1))
	variants := []variant{
		{name: "always", sampler: always},
		{name: "ratio10", sampler: ratio10},
		{name: "metrics"},
		{name: "always-noexemplar", sampler: always, noExemplar: true},
		{name: "ratio10-noexemplar", sampler: ratio10, noExemplar: true},
		{name: "always-simple", sampler: always, simple: true},
		{name: "sdk-span", sampler: always, floor: benchSDKSpan},
		{name: "sdk-floor", sampler: always, floor: benchSDKFloor},
	}
	handler := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			mopts := []sdkmetric.Option{sdkmetric.WithReader(sdkmetric.NewManualReader())}
			if v.noExemplar {
				mopts = append(mopts, sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter))
			}
			mp := sdkmetric.NewMeterProvider(mopts...)
			b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
			in := &telemetry.Config{MeterProvider: mp, Propagator: propagation.TraceContext{}}
			var tp *sdktrace.TracerProvider
			if v.sampler != nil {
				processor := sdktrace.WithBatcher(benchDiscardExporter{})
				if v.simple {
					processor = sdktrace.WithSyncer(benchDiscardExporter{})
				}
				tp = sdktrace.NewTracerProvider(sdktrace.WithSampler(v.sampler), processor)
				b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				in.TracerProvider = tp
			} else {
				in.TracerProvider = noop.NewTracerProvider()
			}
			plain := benchStack(b, benchMemoryBroker(b), router.Config{}, false).ComposeForBenchmark("bench", handler)
			if v.floor != nil {
				other := benchStack(b, benchMemoryBroker(b), router.Config{}, false).ComposeForBenchmark("bench", handler)
				benchInterleaved(b, v.floor(tp, mp)(other), plain)
				return
			}
			traced := benchStack(b, benchMemoryBroker(b), router.Config{Telemetry: in}, false).ComposeForBenchmark("bench", handler)
			benchInterleaved(b, traced, plain)
		})
	}
}

// benchSDKSpan is a step that starts and ends a bare consumer span around each attempt.
func benchSDKSpan(tp *sdktrace.TracerProvider, _ *sdkmetric.MeterProvider) message.HandlerMiddleware {
	tracer := tp.Tracer("bench")
	kind := trace.WithSpanKind(trace.SpanKindConsumer)
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx, span := tracer.Start(msg.Context(), "process bench", kind)
			msg.SetContext(ctx)
			outs, err := h(msg)
			span.End()
			return outs, err
		}
	}
}

// benchSDKFloor is a step that emits what sluice's telemetry emits per successful attempt,
// each part as cheaply as the SDK's API allows: one consumer span with its nine
// attributes (four at start, five set before End), two duration histograms recorded with precomputed attribute sets in the
// span's context. No propagation, counters or reporter: the SDK's part alone.
func benchSDKFloor(tp *sdktrace.TracerProvider, mp *sdkmetric.MeterProvider) message.HandlerMiddleware {
	tracer, meter := tp.Tracer("bench"), mp.Meter("bench")
	h1, _ := meter.Float64Histogram("bench.handler.duration", metric.WithUnit("s"))
	h2, _ := meter.Float64Histogram("bench.process.duration", metric.WithUnit("s"))
	set1 := metric.WithAttributeSet(attribute.NewSet(attribute.String("queue", "q"), attribute.String("handler", "bench"), attribute.String("outcome", "ack")))
	set2 := metric.WithAttributeSet(attribute.NewSet(attribute.String("messaging.system", "rabbitmq"), attribute.String("messaging.operation.name", "process")))
	rec1, rec2 := []metric.RecordOption{set1}, []metric.RecordOption{set2}
	start := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		attribute.String("messaging.system", "rabbitmq"), attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.operation.name", "process"), attribute.String("messaging.destination.name", "q"))}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			t0 := time.Now()
			ctx, span := tracer.Start(msg.Context(), "process q", start...)
			msg.SetContext(ctx)
			outs, err := h(msg)
			span.SetAttributes(attribute.Int("messaging.message.body.size", len(msg.Payload)),
				attribute.String("messaging.message.id", msg.UUID), attribute.Int("sluice.attempt", 1),
				attribute.String("sluice.handler", "bench"), attribute.String("sluice.outcome", "ack"))
			span.End()
			d := time.Since(t0).Seconds()
			h1.Record(ctx, d, rec1...)
			h2.Record(ctx, d, rec2...)
			return outs, err
		}
	}
}

// benchInterleaved times b.N messages through h and b.N through ref, alternating batches,
// reports x-untraced (h's time over ref's), x-untraced-cpu (the same in process CPU time)
// and, per message, each one's time and h's allocations.
func benchInterleaved(b *testing.B, h, ref message.HandlerFunc) {
	const batch = 1024
	id := 0
	batchOf := func(n int) []*message.Message {
		msgs := make([]*message.Message, n)
		for i := range msgs {
			id++
			msgs[i] = message.NewMessage("m-"+strconv.Itoa(id), benchenv.Payload)
		}
		return msgs
	}
	var cpuH, cpuR time.Duration
	run := func(f message.HandlerFunc, msgs []*message.Message, cpu *time.Duration) time.Duration {
		start, startCPU := time.Now(), benchenv.CPUTime()
		for _, m := range msgs {
			if _, err := f(m); err != nil {
				b.Fatal(err)
			}
		}
		*cpu += benchenv.CPUTime() - startCPU
		return time.Since(start)
	}
	var th, tr time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	b.StopTimer()
	for done := 0; done < b.N; {
		n := min(batch, b.N-done)
		a, c := batchOf(n), batchOf(n)
		tr += run(ref, c, &cpuR)
		b.StartTimer()
		th += run(h, a, &cpuH)
		b.StopTimer()
		done += n
	}
	if tr > 0 {
		b.ReportMetric(float64(th)/float64(tr), "x-untraced")
		b.ReportMetric(float64(tr.Nanoseconds())/float64(b.N), "untraced-ns/msg")
	}
	if cpuR > 0 {
		// CPU time, every goroutine of the process: the span processor's and the garbage
		// collector's work counts where it was caused, and other processes' load does not.
		b.ReportMetric(float64(cpuH)/float64(cpuR), "x-untraced-cpu")
		b.ReportMetric(float64(cpuH.Nanoseconds())/float64(b.N), "cpu-ns/msg")
		b.ReportMetric(float64(cpuR.Nanoseconds())/float64(b.N), "untraced-cpu-ns/msg")
	}
}

// BenchmarkDelayAccuracyBusy is broker/amqp's BenchmarkDelayAccuracy (240 delays from
// 100ms to 20s, how late each arrives) with the retry path at full speed beside it: a
// stack as in BenchmarkRetryPath draining busyRetryMessages messages that each fail once,
// on another queue of the same broker, through the same cascade.
//   - sluice: that load alone;
//   - parked: the load, and parkedMessages more messages parked in the cascade
//     beforehand (64-byte bodies, delayed by parkedDelay, so they sit in one cascade queue
//     for the whole measurement and then leave to a queue deleted by then).
//
// retry-handoffs/s is the retry path's rate over the measurement: failed first attempts
// handed to the cascade (their second attempts queue behind the other first attempts).
func BenchmarkDelayAccuracyBusy(b *testing.B) {
	url := testenv.AMQPURL(b)
	b.Run("sluice", func(b *testing.B) { benchDelayBusy(b, url, 0) })
	b.Run("parked", func(b *testing.B) { benchDelayBusy(b, url, parkedMessages) })
}

const (
	busyRetryMessages = 30_000
	parkedMessages    = 100_000
	// parkedDelay is 2^15 cascade units, 8·16^3: one cascade queue (sluice.delay.d3.08)
	// holds a parked message, for 5.5 minutes, longer than a measurement.
	parkedDelay = (1 << 15) * amqp.DelayResolution
)

func benchDelayBusy(b *testing.B, url string, parked int) {
	r := testenv.NewRabbit(b)
	br := benchenv.Broker(b, url)
	if parked > 0 {
		benchPark(b, r, br, parked)
	}
	var handoffs atomic.Int64
	stack, _ := benchRetryLoad(b, r, br, "bench.retryload", busyRetryMessages, &handoffs, nil, true)
	q := benchenv.SluiceQueue(b, r, br, "bench.delaybusy")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sub := br.Subscriber(broker.SubscribeOptions{Concurrency: 16, Prefetch: 64})
	msgs, err := sub.Subscribe(ctx, q)
	if err != nil {
		b.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stack.Run(ctx) }()
	<-stack.Running()
	start, before := time.Now(), handoffs.Load()
	delaybench.Measure(ctx, b, msgs, func(d time.Duration, m *message.Message) error {
		return br.Delay(ctx, q, d, m)
	})
	handed := handoffs.Load() - before
	b.ReportMetric(float64(handed)/time.Since(start).Seconds(), "retry-handoffs/s")
	if handoffs.Load() >= busyRetryMessages {
		b.Logf("the retry load ran out before the measurement ended (%d messages)", busyRetryMessages)
	}
	_ = stack.Close()
	cancel()
	if err := <-stopped; err != nil && !errors.Is(err, context.Canceled) {
		b.Error(err)
	}
}

// benchPark parks n small messages in the cascade, delayed parkedDelay towards a queue
// that is deleted when b ends: pipelined raw publishes to the digit the delay enters at.
func benchPark(b *testing.B, r *testenv.Rabbit, br *amqp.Broker, n int) {
	b.Helper()
	q := benchenv.SluiceQueue(b, r, br, "bench.parked")
	// The raw publishes below go straight to a cascade exchange, which sluice declares on
	// its first delay that long: declare it first (a fresh node has none).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := br.DeclareDelays(ctx, parkedDelay); err != nil {
		b.Fatal(err)
	}
	ch, err := r.Conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	key := benchDelayKey(uint64(parkedDelay/amqp.DelayResolution), q)
	exchange := topology.DelayDigit(15 / 4) // bit 15 is in base-16 digit 3
	body := benchenv.Payload[:64]
	pending := make(chan *amqp091.DeferredConfirmation, 1024)
	nacked := make(chan int)
	go func() {
		k := 0
		for dc := range pending {
			if !dc.Wait() {
				k++
			}
		}
		nacked <- k
	}()
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), exchange, key, true, false,
			amqp091.Publishing{MessageId: "parked-" + strconv.Itoa(i), DeliveryMode: amqp091.Persistent, Body: body})
		if err != nil {
			close(pending)
			<-nacked
			b.Fatal(err)
		}
		pending <- dc
	}
	close(pending)
	if k := <-nacked; k > 0 {
		b.Fatalf("benchPark: %d of %d parked messages nacked", k, n)
	}
}

// BenchmarkRetryPathParked is BenchmarkRetryPath's sluice variant with parkedMessages
// messages parked in the cascade first (see BenchmarkDelayAccuracyBusy): compare its
// msgs/s with BenchmarkRetryPath/sluice of the same run.
func BenchmarkRetryPathParked(b *testing.B) {
	url := testenv.AMQPURL(b)
	// Parked once for every run of the sub-benchmark (go test runs it with growing b.N).
	benchPark(b, testenv.NewRabbit(b), benchenv.Broker(b, url), parkedMessages)
	b.Run("parked", func(b *testing.B) {
		r := testenv.NewRabbit(b)
		br := benchenv.Broker(b, url)
		stack, count := benchRetryLoad(b, r, br, "bench.retryload", b.N, nil, nil, true)
		b.ReportAllocs()
		b.ResetTimer()
		benchRun(b, stack, count, benchenv.ReportRate)
	})
}

// BenchmarkHandlers is the stack's per-message cost as the number of handlers grows: on
// the embedded broker (so that only the stack is measured), the full traced stack with 1 or
// 50 handlers, each on its own queue with concurrency 8, drains b.N messages published
// round-robin over the queues beforehand. msgs/s is from the first message handled to the
// last; cpu-ns/msg (the process's CPU time, startup included), allocs/op and B/op are per
// message. Flat is the goal.
func BenchmarkHandlers(b *testing.B) {
	for _, h := range []int{1, 50} {
		b.Run(strconv.Itoa(h), func(b *testing.B) {
			mb := benchMemoryBroker(b)
			count := benchCountTo(b.N)
			stack := benchStack(b, mb, router.Config{}, true)
			queues := make([]string, h)
			for i := range queues {
				queues[i] = fmt.Sprintf("bench.handlers.%d", i)
				if err := mb.DeclareQueue(context.Background(), queues[i]); err != nil {
					b.Fatal(err)
				}
				if err := stack.Handle(queues[i], queues[i], func(*message.Message) error {
					count.handled()
					return nil
				}, router.WithConcurrency(benchConcurrency)); err != nil {
					b.Fatal(err)
				}
			}
			for i := range b.N {
				id := "m-" + strconv.Itoa(i)
				if err := mb.Publish(queues[i%h], message.NewMessage(id, benchenv.Payload)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			startCPU := benchenv.CPUTime()
			benchRun(b, stack, count, func(b *testing.B) {
				b.ReportMetric(float64((benchenv.CPUTime()-startCPU).Nanoseconds())/float64(b.N), "cpu-ns/msg")
				benchReportRate(b, count)
			})
		})
	}
}
