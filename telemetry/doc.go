// Package telemetry traces and measures every delivery attempt of a message, so that all
// attempts of one message (first try, broker-side retries, the dead-letter hand-off) form
// one OpenTelemetry trace.
//
// Setup builds the tracer and meter providers from the standard OTEL_* environment
// variables and installs them and the W3C propagators globally. New returns an
// Instrumentation whose decorators and middleware carry the trace context in a message's
// headers (traceparent, tracestate):
//
//   - WrapPublisher: a producer span "send <topic>" per published message;
//   - WrapDelayer: a producer span "send sluice.delay" per retry or deferral hand-off;
//   - WrapDeadLetterer: a producer span "send <queue>.dlq" per dead-letter hand-off;
//   - Middleware: a consumer span "process <queue>" per attempt, which must be the
//     outermost step of the stack because it puts the reporter that inner steps
//     report outcomes to into the message context.
//
// Each hand-off injects its own span context into the message it sends, so the consumer
// span of the next attempt is a child of the hand-off span of the previous one.
//
// Span attributes follow the OpenTelemetry messaging semantic conventions (semconv
// v1.43.0) plus sluice's own sluice.* attributes; metrics are the sluice.* instruments
// listed on New.
package telemetry
