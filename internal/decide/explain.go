package decide

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/markers"
)

// View is a handler's settings as the table's sentences name them (router's Describe
// fills it).
type View struct {
	DeadLetterQueue string
	MaxRetries      int
	MaxTotalAge     time.Duration
	MaxRetryAfter   time.Duration
	// Native is set when the queue holds retries back itself (WithNativeRetry).
	Native bool
	// HandlerTimeout, AbandonGrace and MaxAbandoned are the attempt step's.
	HandlerTimeout, AbandonGrace time.Duration
	MaxAbandoned                 int
	// Idempotent is set when the handler has the idempotency step.
	Idempotent bool
	// Budget is the retry budget's sentence ("past the budget of 0.1 of first attempts over
	// 10s, a retry is …"); empty without one.
	Budget string
	// Learned is the learned policy; nil without one.
	Learned *Learned
	// Breaker is "pause" or "defer" while the handler's breaker is open; empty without one.
	Breaker string
	// Compensation names where the handler's compensation event goes; empty without one.
	Compensation string
}

// Learned is the learned policy as the table's sentences name it.
type Learned struct {
	MinEvidence   int64
	UnlikelyBelow float64
	Explore       float64
}

// Row is one line of the decision table: a case and its fate.
type Row struct {
	Case string
	Fate string
}

// Explain returns the table's rules that apply to a handler with settings v, in the order
// Decide reads them, each with its fate in words.
func Explain(v View) []Row {
	var out []Row
	for _, r := range rules {
		if r.says == nil {
			continue
		}
		if s := r.says(v); s != "" {
			out = append(out, Row{Case: r.name, Fate: s})
		}
	}
	return out
}

func (v View) dlq() string {
	if v.DeadLetterQueue == "" {
		return "the dead-letter queue"
	}
	return v.DeadLetterQueue
}

// retryable is the retryable rule's sentence.
func (v View) retryable() string {
	s := fmt.Sprintf("retried after the schedule's delay, up to %d retries (%d attempts) within %s of the first failure; then dead-lettered to %s (retries exhausted)",
		v.MaxRetries, v.MaxRetries+1, v.MaxTotalAge, v.dlq())
	if v.Native {
		s = fmt.Sprintf("rejected back to its queue, which holds it back the schedule's delay (native delayed retry), up to %d retries (%d attempts); then dead-lettered to %s (retries exhausted)",
			v.MaxRetries, v.MaxRetries+1, v.dlq())
	}
	if v.MaxRetries == 0 {
		s = fmt.Sprintf("dead-lettered to %s at once (no retries)", v.dlq())
	}
	if v.Budget != "" {
		s += "; " + v.Budget
	}
	return s
}

// The rules that name a case for operators and decide as the rules after them: an inner
// step's decision or a failure of a known kind. They stand before the rule that decides
// them.
func init() {
	breakerOpen := rule{
		name: "breaker_open",
		when: func(in *Input, _ sluice.Class) bool { return errors.Is(in.Err, markers.ErrBreakerOpen) },
		says: func(v View) string {
			switch v.Breaker {
			case "pause":
				return "the handler pauses (stops taking deliveries, /readyz not ready) and the message goes back to its queue unprocessed, until the breaker lets probes through"
			case "defer":
				return "each message is deferred through the delay without using an attempt, until the breaker lets it through"
			}
			return ""
		},
	}
	abandoned := rule{
		name: "handler_timeout",
		when: func(in *Input, _ sluice.Class) bool { return errors.Is(in.Err, sluice.ErrHandlerTimeout) },
		says: func(v View) string {
			if v.HandlerTimeout == 0 {
				return ""
			}
			return fmt.Sprintf("an attempt still running %s after it started (handler timeout %s + grace %s) is abandoned, returned or not: a retryable failure (sluice.handler_timeout, its stack in the record), retried as retryable; at %d abandoned attempts still running the handler pauses (/readyz not ready)",
				v.HandlerTimeout+v.AbandonGrace, v.HandlerTimeout, v.AbandonGrace, v.MaxAbandoned)
		},
	}
	stillRunning := rule{
		name: "still_running",
		when: func(in *Input, _ sluice.Class) bool { return errors.Is(in.Err, markers.ErrStillRunning) },
		says: func(v View) string {
			if !v.Idempotent {
				return ""
			}
			return "its idempotency key is held by an abandoned attempt still running: a failed attempt, retried as retryable (never run beside it, never deferred for free)"
		},
	}
	compensation := rule{
		name: "compensation",
		when: func(*Input, sluice.Class) bool { return false }, // an effect of a dead letter, not a case of its own
		says: func(v View) string {
			if v.Compensation == "" {
				return ""
			}
			return "a message dead-lettered (retries exhausted, permanent, unlikely to recover, over budget; not a discard) also publishes the handler's compensation event to " +
				v.Compensation + ", confirmed with the dead letter before the ack; not when its last attempt was abandoned and may still be running"
		},
	}
	rules = append(rules, compensation)
	insertBefore("unprocessed", breakerOpen)
	insertBefore(sluice.ClassRetryable.String(), abandoned, stillRunning)
}

// insertBefore puts rs before the rule named name.
func insertBefore(name string, rs ...rule) {
	for i, r := range rules {
		if r.name == name {
			rules = append(rules[:i], append(rs, rules[i:]...)...)
			return
		}
	}
	panic("decide: no rule " + name)
}
