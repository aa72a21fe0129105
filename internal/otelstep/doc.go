// Package otelstep is the instrumentation behind package telemetry: the consumer step
// (Middleware, Observe), the producer spans of every publish and hand-off (WrapPublisher,
// WrapDelayer, WrapDeadLetterer), the batch span, the metrics a router.Stack registers
// (breakers, overload guard, abandoned attempts) and those otelsetup.Operate registers
// (broker connection, idempotency journal), and Rebind. telemetry.Instrumentation is its
// public face; the router and otelsetup use it directly, so that none of the rest is
// public API. Package telemetry's documentation describes the spans, metrics and costs.
package otelstep
