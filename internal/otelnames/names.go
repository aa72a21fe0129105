// Package otelnames holds the names of sluice's metrics and of its span and metric
// attributes, for package telemetry that records them and for the tests and the CLI that
// read them. docs/operations.md (Metrics) lists the names the Prometheus exporter writes.
package otelnames

import (
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Span and metric attributes that are sluice's own, beside the messaging conventions.
const (
	// AttrAttempt is the attempt number, counting from 1: x-retry-count + 1 of the message
	// consumed, or on a hand-off span of the message handed off.
	AttrAttempt = attribute.Key("sluice.attempt")
	// AttrOutcome is the outcome of a consumer attempt (ack, retry, dead_letter, ...).
	AttrOutcome = attribute.Key("sluice.outcome")
	// AttrRetryDelayMS is the broker-side delay of a retry or deferral, in milliseconds.
	AttrRetryDelayMS = attribute.Key("sluice.retry.delay_ms")
	// AttrHandler is the name of the handler that processed the message.
	AttrHandler = attribute.Key("sluice.handler")
	// AttrQueue is the queue a delayed or dead-lettered message belongs to.
	AttrQueue = attribute.Key("sluice.queue")
	// AttrDeferReason is the reason of a deferral (a deferral is not a failure).
	AttrDeferReason = attribute.Key("sluice.defer.reason")
	// AttrLastError is the error type recorded on a message sent to its dead-letter queue.
	AttrLastError = attribute.Key("sluice.last_error")
)

// Metric attribute keys. They are short because they become Prometheus labels.
const (
	// MetricAttrQueue is the queue a metric was recorded for.
	MetricAttrQueue = attribute.Key("queue")
	// MetricAttrHandler is the handler a metric was recorded for.
	MetricAttrHandler = attribute.Key("handler")
	// MetricAttrOutcome is the outcome a metric was recorded for.
	MetricAttrOutcome = attribute.Key("outcome")
	// MetricAttrBreaker is the circuit breaker a state was observed for.
	MetricAttrBreaker = attribute.Key("breaker")
)

// Metric instrument names.
const (
	// MetricMessages counts attempts by queue, handler and outcome.
	MetricMessages = "sluice.messages"
	// MetricRetries counts attempts handed off for a retry.
	MetricRetries = "sluice.retries"
	// MetricDeadLetters counts messages sent to a dead-letter queue.
	MetricDeadLetters = "sluice.dead_letters"
	// MetricIdempotencyHits counts duplicates acknowledged without calling the handler.
	MetricIdempotencyHits = "sluice.idempotency.hits"
	// MetricHandlerDuration is the time an attempt spent in the stack below telemetry.
	MetricHandlerDuration = "sluice.handler.duration"
	// MetricInFlight is the number of attempts being processed.
	MetricInFlight = "sluice.messages.in_flight"
	// MetricBreakerState is each circuit breaker's state: 0 closed, 1 half-open, 2 open.
	MetricBreakerState = "sluice.breaker.state"
)

// The OpenTelemetry messaging semantic-convention metrics (semconv v1.43.0). Each point
// carries messaging.system, messaging.operation.name ("process" or "send"),
// messaging.destination.name and, for a failed operation, error.type.
const (
	// MetricProcessDuration is messaging.process.duration: the time an attempt took,
	// handler and every step below telemetry included (seconds).
	MetricProcessDuration = "messaging.process.duration"
	// MetricConsumedMessages is messaging.client.consumed.messages: deliveries handed to
	// the stack, redeliveries and retries included.
	MetricConsumedMessages = "messaging.client.consumed.messages"
	// MetricSentMessages is messaging.client.sent.messages: messages the stack published
	// (outputs, retry hand-offs to sluice.delay, dead letters to Q.dlq), counted once each
	// whether the publish succeeded or not (error.type says it failed).
	MetricSentMessages = "messaging.client.sent.messages"
	// MetricOperationDuration is messaging.client.operation.duration of the "send"
	// operation: one publish call until RabbitMQ confirmed it (seconds).
	MetricOperationDuration = "messaging.client.operation.duration"
)

// Sluice's own metrics beside the conventions.
const (
	// MetricRetryDelay is the broker-side delay each retry was given (seconds).
	MetricRetryDelay = "sluice.retry.delay"
	// MetricRetryOutcomes counts, per handler and error type, the messages that failed
	// with it and how their retries ended (retrystats.RetryEventOf): outcome "failed",
	// "retried" (a retry spent), "recovered", "exhausted", "permanent", "discarded",
	// "dead_lettered", "retry_unlikely".
	MetricRetryOutcomes = "sluice.retry.outcomes"
	// MetricRetryRecoveryAttempt is the attempt at which a retried message recovered.
	MetricRetryRecoveryAttempt = "sluice.retry.recovery.attempt"
)

// MetricAttrErrorType labels retries, dead letters and failed operations. Its values are
// capped; see telemetry.WithErrorTypeLimit.
var MetricAttrErrorType = semconv.ErrorTypeKey

// Connection metrics.
const (
	// MetricConnectionUp is 1 while the broker connection is up, else 0.
	MetricConnectionUp = "sluice.connection.up"
	// MetricReconnects counts connections re-established after a loss.
	MetricReconnects = "sluice.connection.reconnects"
	// MetricJournalRestoredKeys is the number of idempotency keys the last restores read.
	MetricJournalRestoredKeys = "sluice.idempotency.journal.restored_keys"
	// MetricJournalRestoreDuration is the longest restore of an idempotency journal.
	MetricJournalRestoreDuration = "sluice.idempotency.journal.restore_duration"
	// MetricJournalRestoring is the number of idempotency journals not caught up yet.
	MetricJournalRestoring = "sluice.idempotency.journal.restoring"
	// MetricJournalAppended counts idempotency journal records confirmed by the broker.
	MetricJournalAppended = "sluice.idempotency.journal.appended"
	// MetricJournalFailures counts idempotency journal appends that failed.
	MetricJournalFailures = "sluice.idempotency.journal.failures"
	// MetricJournalSkipped counts journal messages that were not record batches.
	MetricJournalSkipped = "sluice.idempotency.journal.skipped"
	// MetricJournalLag is how old the last record from the journal was when applied.
	MetricJournalLag = "sluice.idempotency.journal.lag"
	// MetricJournalUnconfirmed is the number of keys done but not journaled yet.
	MetricJournalUnconfirmed = "sluice.idempotency.journal.unconfirmed"
	// MetricJournalRecreated counts journal streams found deleted and declared again.
	MetricJournalRecreated = "sluice.idempotency.journal.recreated"
)

// Queue depth metrics, read from the broker by a telemetry.DepthWatcher.
const (
	// MetricQueueDepth is the number of messages in a queue (queue, kind, state): state
	// "ready" (waiting for a consumer) or "unacked" (delivered, not yet acknowledged; only
	// from a source that knows it, see telemetry.QueueDepth.UnackedKnown).
	MetricQueueDepth = "sluice.queue.depth"
	// MetricQueueConsumers is the number of consumers of a queue (queue, kind).
	MetricQueueConsumers = "sluice.queue.consumers"
)

// Labels of the depth metrics.
const (
	// MetricAttrKind is the role of a queue: one of the QueueKind constants.
	MetricAttrKind = attribute.Key("kind")
	// MetricAttrState is "ready" or "unacked".
	MetricAttrState = attribute.Key("state")
)

// MetricLogDropped counts the retry and dead-letter log lines the rate limit dropped, by
// event (retry, dead_letter).
const MetricLogDropped = "sluice.log.dropped"

// MetricAttrEvent labels MetricLogDropped.
const MetricAttrEvent = "event"

// MetricReady is 1 while ReadinessPath answers 200, else 0: what an alert on a consumer
// that is not ready reads, since Prometheus does not probe /readyz itself.
const MetricReady = "sluice.ready"

// Metric instrument names of the overload protection.
const (
	// MetricHandlerPaused is 1 while a handler has stopped taking deliveries because its
	// breaker is open (or half-open with its probes out), else 0.
	MetricHandlerPaused = "sluice.handler.paused"
	// MetricRetryBudgetRemaining is how many more retries a dependency's budget allows now.
	MetricRetryBudgetRemaining = "sluice.retry.budget.remaining"
	// MetricRetriesRefused counts retries the overload protection refused, by dependency and
	// reason (budget, concurrency).
	MetricRetriesRefused = "sluice.retry.refused"
)

// Metric instrument names of abandoned attempts (router.Config.HandlerTimeout).
const (
	// MetricAbandoned counts attempts the stack stopped waiting for at their handler
	// timeout or at close (queue, handler).
	MetricAbandoned = "sluice.handler.abandoned"
	// MetricAbandonedRunning is, per handler, the abandoned attempts whose goroutine has
	// not returned yet.
	MetricAbandonedRunning = "sluice.handler.abandoned.running"
)

// Metric attribute keys of the overload metrics.
const (
	// MetricAttrDependency is the dependency a retry budget or refusal is about.
	MetricAttrDependency = attribute.Key("dependency")
	// MetricAttrReason is why a retry was refused.
	MetricAttrReason = attribute.Key("reason")
)

// Span event names of the idempotency step (package middleware/idempotency), on the span
// found in the message context (the tracing step's consumer span), so its decisions show in
// traces without that package importing telemetry.
const (
	// EventIdempotencyDuplicate: the key was done already; the message is acked unhandled.
	EventIdempotencyDuplicate = "idempotency.duplicate"
	// EventIdempotencyInFlight: another delivery of the key is being handled.
	EventIdempotencyInFlight = "idempotency.in_flight"
)
