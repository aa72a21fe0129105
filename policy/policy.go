// Package policy is what a sluice stack does with each handler's failures, as operators
// read it: the retry decision matrix of router.Stack.Describe, rendered for a runbook
// (Markdown) or read by a tool (JSON: the service's GET /debug/sluice/policy, `sluice
// policy`, the console). Its error classes are sluice's decision table, the same rules
// the retry step decides by, with the handler's settings.
package policy

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-go/sluice/internal/retrystats"
)

// Duration is a time.Duration written to and read from JSON as a Go duration ("1.5s").
type Duration time.Duration

// String is the Go duration without its zero minutes and seconds ("24h", "1m30s").
func (d Duration) String() string {
	s := time.Duration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// MarshalJSON writes the Go duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a Go duration string (or a number of nanoseconds).
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if nerr := json.Unmarshal(b, &n); nerr != nil {
			return fmt.Errorf("duration: %w", err)
		}
		*d = Duration(n)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Description is what a stack does with each handler's failures: the retry decision
// matrix an operator reads in a runbook (Markdown) or a tool reads as JSON (the service's
// GET /debug/sluice/policy). Stack.Describe builds it from the settings in force.
type Description struct {
	// Handlers are the stack's handlers, by name.
	Handlers []HandlerDescription `json:"handlers"`
	// Breakers are the stack's circuit breakers created so far (Config.Breaker or
	// Config.Breakers), by dependency name.
	Breakers []BreakerState `json:"breakers,omitempty"`
	// Notes say what the description could not tell.
	Notes []string `json:"notes,omitempty"`
}

// HandlerDescription is one handler's row of the matrix.
type HandlerDescription struct {
	Name string `json:"name"`
	// Queue is the queue the handler was registered on; empty when the stack could not
	// tell (see Description.Notes).
	Queue string `json:"queue"`
	// Consumes are the queues its consumers read: Queue, or its partitions.
	Consumes []string `json:"consumes"`
	// Partitions is the WithPartitions count; zero for a plain queue.
	Partitions int `json:"partitions,omitempty"`
	// DeadLetterQueue and Archive are where its dead letters go and where operators
	// archive them.
	DeadLetterQueue string `json:"dead_letter_queue"`
	Archive         string `json:"archive"`
	// HandlerTimeout is the deadline of one attempt (a retryable failure when passed);
	// AbandonGrace how long past it the stack still waits before it abandons the attempt;
	// MaxAbandoned how many abandoned attempts may still run before the handler pauses.
	HandlerTimeout Duration `json:"handler_timeout"`
	AbandonGrace   Duration `json:"abandon_grace"`
	MaxAbandoned   int      `json:"max_abandoned"`
	// SettleWithin is how long after its delivery the stack acks or gives back any of the
	// handler's deliveries at the latest, a wait in the prefetch buffer included: the
	// consumer timeout the broker is asked not to go below (docs/reliability.md).
	SettleWithin Duration `json:"settle_within"`
	// ErrorClasses say what each class of error leads to.
	ErrorClasses []ClassAction `json:"error_classes"`
	// Retry is the retry policy.
	Retry RetryPolicy `json:"retry"`
	// Breaker is the handler's circuit breaker; nil without Config.Breaker (or Breakers).
	Breaker *BreakerDescription `json:"breaker,omitempty"`
	// Idempotency is the idempotency step; nil without Config.Idempotency.
	Idempotency *IdempotencyDescription `json:"idempotency,omitempty"`
	// Learned is the learned retry policy's current view of each error type the handler
	// failed with in the statistics' window; nil without Config.Retry.Learned.
	Learned []LearnedView `json:"learned,omitempty"`
	// Compensation is where the handler's compensation event goes on a final dead letter
	// (router.WithCompensation): "exchange <name>, key <key>" or "queue <name>"; empty
	// without one.
	Compensation string `json:"compensation,omitempty"`
}

// ClassAction is what an error class leads to.
type ClassAction struct {
	// Class is an error class (sluice.Class's names), or "retry_after",
	// "retry_unlikely" (the learned policy) and "breaker_open".
	Class  string `json:"class"`
	Action string `json:"action"`
}

// RetryPolicy is the retry step's policy as it applies to a handler.
type RetryPolicy struct {
	// MaxRetries is how many retries a message gets after its first attempt;
	// MaxAttempts is MaxRetries+1.
	MaxRetries  int `json:"max_retries"`
	MaxAttempts int `json:"max_attempts"`
	// The backoff: InitialDelay grown by Multiplier up to MaxDelay, randomized by ±Jitter.
	InitialDelay Duration `json:"initial_delay"`
	Multiplier   float64  `json:"multiplier"`
	MaxDelay     Duration `json:"max_delay"`
	Jitter       float64  `json:"jitter"`
	// MaxTotalAge bounds a message's retries and deferrals from its first failure.
	MaxTotalAge Duration `json:"max_total_age"`
	// MaxRetryAfter caps a RetryAfter wait and a single Defer.
	MaxRetryAfter Duration `json:"max_retry_after"`
	// Schedule is every retry's delay.
	Schedule []ScheduledRetry `json:"schedule"`
	// Budget is the overload protection (Config.Retry.Overload); nil without it.
	Budget *RetryBudget `json:"budget,omitempty"`
	// Learned is the learned policy's settings; nil without one.
	Learned *retrystats.LearnedSettings `json:"learned,omitempty"`
	// Native is the queue's own delayed retry (WithNativeRetry); nil without one. With
	// it, Schedule is the queue's linear schedule, without jitter.
	Native *NativeRetryPolicy `json:"native,omitempty"`
}

// NativeRetryPolicy is a handler's native delayed retry (WithNativeRetry): the queue holds
// a rejected delivery back Min × its delivery count, at most Max.
type NativeRetryPolicy struct {
	Min Duration `json:"min"`
	Max Duration `json:"max"`
}

// ScheduledRetry is one retry of the schedule.
type ScheduledRetry struct {
	// Retry counts from 1; the message comes back for attempt Retry+1.
	Retry   int `json:"retry"`
	Attempt int `json:"attempt"`
	// Delay is the backoff before it without jitter (retry.Retry.Backoff(Retry) with
	// NoJitter); MinDelay and MaxDelay bound it with jitter.
	Delay    Duration `json:"delay"`
	MinDelay Duration `json:"min_delay"`
	MaxDelay Duration `json:"max_delay"`
	// Elapsed is the sum of the delays up to this one: how long after its first failure
	// the attempt comes, handler time aside.
	Elapsed Duration `json:"elapsed"`
}

// RetryBudget is the overload protection of a handler's dependency.
type RetryBudget struct {
	// Dependency is the name the budget is kept under (WithBreaker's, else the handler's
	// name); empty when the stack could not tell.
	Dependency string `json:"dependency,omitempty"`
	// Ratio of first attempts that retries may add over Window, with a floor of
	// MinRetriesPerSecond.
	Ratio               float64  `json:"ratio"`
	Window              Duration `json:"window"`
	MinRetriesPerSecond float64  `json:"min_retries_per_second"`
	// WhenSpent says what a refused retry does.
	WhenSpent string `json:"when_spent"`
	// MaxConcurrentRetries caps the retries running at once (0: no cap); a retry past it is
	// deferred by ConcurrencyDelay.
	MaxConcurrentRetries int      `json:"max_concurrent_retries"`
	ConcurrencyDelay     Duration `json:"concurrency_delay"`
	// Adaptive is true when an adaptive policy trims retries under load.
	Adaptive bool `json:"adaptive"`
	// Left is the budget left now, when the dependency is known and has one.
	Left *float64 `json:"left,omitempty"`
}

// BreakerDescription is a handler's circuit breaker.
type BreakerDescription struct {
	// Dependency names the breaker (WithBreaker's name, else the handler's), inferred from
	// the registry's breakers: the one named after the handler, else the only one named
	// after none of the stack's handlers; empty when that leaves several.
	Dependency string `json:"dependency,omitempty"`
	// WhileOpen is "pause" (the handler stops taking deliveries) or "defer" (messages go
	// back through the delay until the breaker lets them through: WithDeferWhileOpen).
	WhileOpen string `json:"while_open"`
	// State, OpenTimeout and HalfOpenProbes are the breaker's, when it is known.
	State          string   `json:"state,omitempty"`
	OpenTimeout    Duration `json:"open_timeout,omitempty"`
	HalfOpenProbes int      `json:"half_open_probes,omitempty"`
}

// BreakerState is a circuit breaker of the stack's registry.
type BreakerState struct {
	Dependency     string   `json:"dependency"`
	State          string   `json:"state"`
	OpenTimeout    Duration `json:"open_timeout"`
	HalfOpenProbes int      `json:"half_open_probes"`
}

// IdempotencyDescription is a handler's idempotency step.
type IdempotencyDescription struct {
	// Step is the step's Go type.
	Step string `json:"step"`
	// Key says where a message's key comes from.
	Key string `json:"key"`
	// Journal is the stream the done keys are journaled on; empty when they are not.
	Journal string `json:"journal,omitempty"`
}

// LearnedView is the learned policy's view of one error type of a handler.
type LearnedView struct {
	ErrorType string `json:"error_type"`
	retrystats.Verdict
}

// SettleText says SettleWithin for a reader: "every delivery settled within …", or that
// the service did not report it (a description from a sluice before the bound).
func (h HandlerDescription) SettleText() string {
	if h.SettleWithin <= 0 {
		return "not reported by the service"
	}
	return fmt.Sprintf("every delivery settled within %s of its delivery, prefetch wait included; RabbitMQ's consumer timeout must not be lower", h.SettleWithin)
}

// CompensationText says in words what the handler publishes when a message's fate is final:
// "none" without a compensation.
func (h HandlerDescription) CompensationText() string {
	if h.Compensation == "" {
		return "none"
	}
	return "on a final dead letter (not a discard, not an abandoned attempt that may still run): an event to " +
		h.Compensation + ", confirmed with the dead letter before the ack; id derived from the message id and its replay count"
}
