// Package telemetry traces and measures every delivery attempt of a message, so that all
// attempts of one message (first try, broker-side retries, the dead-letter hand-off) form
// one OpenTelemetry trace.
//
// The package depends on the OpenTelemetry API only, so that the library's core compiles
// no SDK, exporter, gRPC or Prometheus client. Package telemetry/otelsetup is the
// application's side: its Setup builds the tracer and meter providers from the standard
// OTEL_* environment variables and installs them and the W3C propagators globally, its
// Operate adds the queue-depth, connection and readiness wiring, and its Run does both
// around a stack's Run.
//
// A router.Stack traces itself from a Config (router.Config.Telemetry; &Config{} reads the
// global providers); New returns the same Instrumentation for a Watermill router of the
// user's own (Middleware, Observe) and for a producer (WrapPublisher). The trace context
// travels in a message's headers (traceparent, tracestate):
//
//   - a producer span "send <topic>" per published message (WrapPublisher, and the
//     stack's outputs);
//   - a producer span "send sluice.delay" per retry or deferral hand-off, and "send
//     <queue>.dlq" per dead-letter hand-off, made by the stack;
//   - a settle span "reject <queue>" per native delayed retry (RabbitMQ 4.3), which the
//     next attempt this instance consumes continues;
//   - a consumer span "process <queue>" per attempt (Middleware), which must be the
//     outermost step because it puts what inner steps report outcomes to (Observe) into
//     the message context.
//
// Each hand-off injects its own span context into the message it sends, so the consumer
// span of the next attempt is a child of the hand-off span of the previous one.
//
// Span attributes follow the OpenTelemetry messaging semantic conventions (semconv
// v1.43.0) plus sluice's own sluice.* attributes; metrics are the instruments listed on
// New, the queue depths of WatchDepth, and those otelsetup.Operate adds.
//
// # Cost
//
// Per attempt the consumer step makes one span (the conventions' "process" span; the
// success path has no other), two histogram measurements (sluice.handler.duration and
// messaging.process.duration, the only ones given the span's context, for exemplars) and
// three counts (attempts consumed, in flight, by outcome), which are atomic integers read
// by observable instruments when a reader collects, not measurements. Attribute sets and
// span options are built once per queue and handler. A span that is not sampled gets no
// attributes beyond the four it starts with (messaging.system, messaging.operation.type
// and .name, messaging.destination.name, those a sampler may decide on).
//
// The rest is the OpenTelemetry SDK's, and set by choices that are the user's, on the
// providers in Config (or through OTEL_* variables with otelsetup.Setup).
// BenchmarkTracingOverhead in router/perf_bench_test.go measures each beside the untraced
// stack in one run; on a shared 2-core machine, in CPU time a message (BENCHMARKS.md,
// "Performance targets", has the full table):
//
//   - Sampler. Every span sampled (the SDK's default, ParentBased(AlwaysSample)): 4.8–5.3x
//     the untraced stack. ParentBased(TraceIDRatioBased(0.1)) (OTEL_TRACES_SAMPLER=
//     parentbased_traceidratio, OTEL_TRACES_SAMPLER_ARG=0.1): 3.1x, and it keeps whole
//     traces, since every attempt and hand-off follows its parent's decision. Metrics
//     alone (no tracer provider): 1.8x. A bare SDK span, started and ended with nothing
//     else, is 2.5x by itself with the batch processor: with every attempt sampled, tracing
//     cannot cost less than that.
//   - Exemplar filter. The default, trace_based, offers the two histogram measurements of a
//     sampled attempt to a reservoir (a clock read and a lock each); exemplar.AlwaysOffFilter
//     (sdkmetric.WithExemplarFilter, or OTEL_METRICS_EXEMPLAR_FILTER=always_off) saves 5–10%
//     of a sampled attempt's cost and loses the link from a slow bucket to its trace.
//   - Span processor. The batch processor (sdktrace.WithBatcher, what otelsetup.Setup uses) wakes its
//     goroutine for each span; the simple processor (sdktrace.WithSyncer) measured 3.7x
//     against the batch processor's 5x, but only because the benchmark's exporter discards:
//     a real exporter then sends every span on the handler's goroutine, a network call per
//     attempt. Use the batch processor; raise its queue size
//     (sdktrace.WithMaxQueueSize, OTEL_BSP_MAX_QUEUE_SIZE) if spans are dropped under load.
//   - Span limits. The consumer span carries nine to twelve attributes, and events only on
//     failures and deferrals, under the SDK's default limits (128); lowering them saves
//     nothing on the success path.
package telemetry
