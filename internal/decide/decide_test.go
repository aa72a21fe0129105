package decide_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/markers"
)

var (
	errBoom   = errors.New("boom")
	errBudget = errors.New("budget spent")
)

// TestDecide is sluice's whole decision table, one row per fate and per input that
// changes it.
func TestDecide(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	policy := decide.Policy{
		MaxRetries: 3, MaxTotalAge: time.Hour, MaxRetryAfter: time.Minute,
		Backoff: func(n int) time.Duration { return time.Duration(n) * time.Second },
	}
	unprocessed := markers.ReturnUnprocessed(errBoom)
	evidence := decide.Evidence{ErrorType: "error", Recovered: 0, Ended: 312, Window: time.Hour}
	refuse := func(time.Duration) (time.Duration, error) { return 0, errBudget }
	stretch := func(d time.Duration) (time.Duration, error) { return d * 10, nil }
	abandoned := fmt.Errorf("handler abandoned: %w", sluice.ErrHandlerTimeout)
	tests := []struct {
		name     string
		in       decide.Input // Policy defaults to policy; History.Now to now
		want     disposition.Kind
		delay    time.Duration
		is       error // the reason matches it
		heldBack bool
		unproc   bool
	}{
		{name: "success", in: decide.Input{}, want: disposition.Ack},
		{name: "first failure", in: decide.Input{Err: errBoom}, want: disposition.Retry, delay: time.Second, is: errBoom},
		{name: "third failure", in: decide.Input{Err: errBoom, History: decide.History{Retries: 2}}, want: disposition.Retry, delay: 3 * time.Second, is: errBoom},
		{name: "retries used up", in: decide.Input{Err: errBoom, History: decide.History{Retries: 3}}, want: disposition.DeadLetter, is: disposition.ErrRetriesExhausted},
		{name: "older than MaxTotalAge", in: decide.Input{Err: errBoom, History: decide.History{Retries: 1, FirstFailure: now.Add(-2 * time.Hour)}}, want: disposition.DeadLetter, is: disposition.ErrRetriesExhausted},
		{name: "RetryAfter", in: decide.Input{Err: sluice.RetryAfter(7*time.Second, errBoom)}, want: disposition.Retry, delay: 7 * time.Second, is: errBoom},
		{name: "RetryAfter capped", in: decide.Input{Err: sluice.RetryAfter(time.Hour, errBoom)}, want: disposition.Retry, delay: time.Minute, is: errBoom},
		{name: "Permanent", in: decide.Input{Err: sluice.Permanent(errBoom)}, want: disposition.DeadLetter, is: errBoom},
		{name: "Discard", in: decide.Input{Err: sluice.Discard(errBoom)}, want: disposition.Discard, is: errBoom},
		{name: "Defer", in: decide.Input{Err: sluice.Defer(5*time.Second, errBoom)}, want: disposition.Defer, delay: 5 * time.Second, is: errBoom},
		{name: "Defer capped", in: decide.Input{Err: sluice.Defer(time.Hour, errBoom)}, want: disposition.Defer, delay: time.Minute, is: errBoom},
		{name: "Defer uses no attempt", in: decide.Input{Err: sluice.Defer(time.Second, errBoom), History: decide.History{Retries: 3}}, want: disposition.Defer, delay: time.Second},
		{name: "Defer expired", in: decide.Input{Err: sluice.Defer(time.Second, errBoom), History: decide.History{FirstDefer: now.Add(-2 * time.Hour)}}, want: disposition.DeadLetter, is: disposition.ErrDeferralExpired},
		{name: "an inner step returns it unprocessed", in: decide.Input{Err: unprocessed}, want: disposition.GiveBack, is: errBoom, unproc: true},
		{name: "returned unprocessed, wrapped", in: decide.Input{Err: fmt.Errorf("step: %w", unprocessed)}, want: disposition.GiveBack, is: errBoom, unproc: true},
		{name: "the breaker pauses: unprocessed", in: decide.Input{Err: markers.ReturnUnprocessed(fmt.Errorf("breaker %q: %w", "gw", markers.ErrBreakerOpen))}, want: disposition.GiveBack, is: markers.ErrBreakerOpen, unproc: true},
		{name: "the breaker defers", in: decide.Input{Err: sluice.Defer(2*time.Second, markers.ErrBreakerOpen)}, want: disposition.Defer, delay: 2 * time.Second, is: markers.ErrBreakerOpen},
		{name: "consumer stopping: given back unprocessed", in: decide.Input{Err: errBoom, Stopping: true}, want: disposition.GiveBack, is: errBoom, unproc: true},
		{name: "consumer stopping, Permanent: given back too", in: decide.Input{Err: sluice.Permanent(errBoom), Stopping: true}, want: disposition.GiveBack, unproc: true},
		{name: "consumer stopping, success: acked", in: decide.Input{Stopping: true}, want: disposition.Ack},
		{name: "hand-off failed: given back, rejected", in: decide.Input{Err: errBoom, HandOff: errBudget}, want: disposition.GiveBack, is: errBudget},
		{name: "hand-off of a success's outputs failed", in: decide.Input{HandOff: errBudget}, want: disposition.GiveBack, is: errBudget},
		{name: "no delay: retryable dead-lettered at once", in: decide.Input{Err: errBoom, Policy: decide.Policy{NoDelay: true}}, want: disposition.DeadLetter, is: errBoom},
		{name: "no delay: Defer dead-lettered at once", in: decide.Input{Err: sluice.Defer(time.Second, errBoom), Policy: decide.Policy{NoDelay: true}}, want: disposition.DeadLetter, is: errBoom},
		{name: "no delay: Discard still acked", in: decide.Input{Err: sluice.Discard(errBoom), Policy: decide.Policy{NoDelay: true}}, want: disposition.Discard},
		{name: "unlikely: a retryable failure dead-lettered at once", in: decide.Input{Err: errBoom, Policy: decide.Policy{Unlikely: &evidence}}, want: disposition.DeadLetter, is: disposition.ErrRetryUnlikely},
		{name: "unlikely: RetryAfter dead-lettered at once", in: decide.Input{Err: sluice.RetryAfter(time.Second, errBoom), Policy: decide.Policy{Unlikely: &evidence}}, want: disposition.DeadLetter, is: disposition.ErrRetryUnlikely},
		{name: "unlikely: Permanent stays Permanent", in: decide.Input{Err: sluice.Permanent(errBoom), Policy: decide.Policy{Unlikely: &evidence}}, want: disposition.DeadLetter, is: errBoom},
		{name: "unlikely: Discard still acked", in: decide.Input{Err: sluice.Discard(errBoom), Policy: decide.Policy{Unlikely: &evidence}}, want: disposition.Discard},
		{name: "unlikely: Defer still deferred", in: decide.Input{Err: sluice.Defer(time.Second, errBoom), Policy: decide.Policy{Unlikely: &evidence}}, want: disposition.Defer, delay: time.Second},
		{name: "shortened: exhausted at the cut", in: decide.Input{Err: errBoom, History: decide.History{Retries: 1}, Policy: decide.Policy{MaxRetries: 1, Shortened: &decide.Shortening{To: 2, Recoveries: 120}}}, want: disposition.DeadLetter, is: decide.ErrScheduleShortened},
		{name: "budget refuses: dead-lettered with its reason", in: decide.Input{Err: errBoom, Admit: refuse}, want: disposition.DeadLetter, is: errBudget},
		{name: "budget refuses a RetryAfter too", in: decide.Input{Err: sluice.RetryAfter(time.Second, errBoom), Admit: refuse}, want: disposition.DeadLetter, is: errBudget},
		{name: "budget spent: the delay stretched", in: decide.Input{Err: errBoom, Admit: stretch}, want: disposition.Retry, delay: 10 * time.Second, is: errBoom},
		{name: "budget not asked for a Permanent", in: decide.Input{Err: sluice.Permanent(errBoom), Admit: refuse}, want: disposition.DeadLetter, is: errBoom},
		{name: "native: held back by the queue", in: decide.Input{Err: errBoom, Native: &decide.Native{Delay: time.Second}}, want: disposition.Retry, delay: time.Second, heldBack: true},
		{name: "native: a stretched delay goes through the delay", in: decide.Input{Err: errBoom, Native: &decide.Native{Delay: time.Second}, Admit: stretch}, want: disposition.Retry, delay: 10 * time.Second},
		{name: "native: a RetryAfter goes through the delay", in: decide.Input{Err: sluice.RetryAfter(7*time.Second, errBoom), Native: &decide.Native{Delay: 7 * time.Second}}, want: disposition.Retry, delay: 7 * time.Second},
		{name: "native: a probe goes through the delay", in: decide.Input{Err: errBoom, Native: &decide.Native{Delay: time.Second, Probe: true}}, want: disposition.Retry, delay: time.Second},
		{name: "native: exhausted still dead-lettered", in: decide.Input{Err: errBoom, History: decide.History{Retries: 3}, Native: &decide.Native{Delay: time.Second}}, want: disposition.DeadLetter, is: disposition.ErrRetriesExhausted},
		{name: "handler timeout: retried like any failure", in: decide.Input{Err: abandoned}, want: disposition.Retry, delay: time.Second, is: sluice.ErrHandlerTimeout},
		{name: "handler timeout: exhausted", in: decide.Input{Err: abandoned, History: decide.History{Retries: 3}}, want: disposition.DeadLetter, is: sluice.ErrHandlerTimeout},
		{name: "handler timeout at close: given back unprocessed", in: decide.Input{Err: markers.ReturnUnprocessed(abandoned)}, want: disposition.GiveBack, is: sluice.ErrHandlerTimeout, unproc: true},
		{name: "still running elsewhere: a failed attempt", in: decide.Input{Err: markers.ErrStillRunning}, want: disposition.Retry, delay: time.Second, is: markers.ErrStillRunning},
		{name: "still running elsewhere: dead-lettered after the retries", in: decide.Input{Err: markers.ErrStillRunning, History: decide.History{Retries: 3}}, want: disposition.DeadLetter, is: markers.ErrStillRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			if in.Policy.MaxTotalAge == 0 {
				p := policy
				p.NoDelay, p.Unlikely, p.Shortened = in.Policy.NoDelay, in.Policy.Unlikely, in.Policy.Shortened
				if in.Policy.MaxRetries != 0 {
					p.MaxRetries = in.Policy.MaxRetries
				}
				in.Policy = p
			}
			in.History.Now = now
			d := decide.Decide(in)
			assert.Equal(t, tt.want, d.Kind, "%v", d.Reason)
			assert.Equal(t, tt.delay, d.Delay)
			assert.Equal(t, tt.heldBack, d.HeldBack, "held back by the queue")
			assert.Equal(t, tt.unproc, d.Unprocessed, "returned unprocessed")
			if tt.want == disposition.Ack {
				assert.NoError(t, d.Reason)
			} else {
				assert.Error(t, d.Reason)
			}
			if tt.is != nil {
				assert.ErrorIs(t, d.Reason, tt.is)
			}
		})
	}
}

// TestDecide_Compensate: a handler's compensation goes with a final dead letter, never with
// a discard or a retry, nor when the last attempt may still be running.
func TestDecide_Compensate(t *testing.T) {
	policy := decide.Policy{MaxRetries: 1, MaxTotalAge: time.Hour, MaxRetryAfter: time.Hour}
	abandoned := fmt.Errorf("abandoned: %w", sluice.ErrHandlerTimeout)
	tests := []struct {
		name string
		in   decide.Input
		want bool
	}{
		{name: "retries exhausted", in: decide.Input{Err: errBoom, History: decide.History{Retries: 1}}, want: true},
		{name: "permanent", in: decide.Input{Err: sluice.Permanent(errBoom)}, want: true},
		{name: "unlikely to recover", in: decide.Input{Err: errBoom, Policy: decide.Policy{Unlikely: &decide.Evidence{}}}, want: true},
		{name: "over budget", in: decide.Input{Err: errBoom, Admit: func(time.Duration) (time.Duration, error) { return 0, errBudget }}, want: true},
		{name: "a retry", in: decide.Input{Err: errBoom}, want: false},
		{name: "a discard", in: decide.Input{Err: sluice.Discard(errBoom)}, want: false},
		{name: "a hand-off that failed", in: decide.Input{Err: sluice.Permanent(errBoom), HandOff: errBudget}, want: false},
		{name: "last attempt abandoned, may still run", in: decide.Input{Err: abandoned, History: decide.History{Retries: 1}}, want: false},
		{name: "key held by an abandoned attempt", in: decide.Input{Err: markers.ErrStillRunning, History: decide.History{Retries: 1}}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			in.Compensation = true
			if in.Policy.Unlikely != nil {
				in.Policy.MaxRetries, in.Policy.MaxTotalAge, in.Policy.MaxRetryAfter = 1, time.Hour, time.Hour
			} else {
				in.Policy = policy
			}
			in.History.Now = time.Now()
			assert.Equal(t, tt.want, decide.Decide(in).Compensate)
			in.Compensation = false
			assert.False(t, decide.Decide(in).Compensate, "a handler without a compensation never compensates")
		})
	}
}

func TestKind_String(t *testing.T) {
	// The labels of metrics and spans, unchanged by the typed value.
	want := map[disposition.Kind]string{
		disposition.Ack: "ack", disposition.Retry: "retry", disposition.Defer: "deferred",
		disposition.DeadLetter: "dead_letter", disposition.Discard: "discard", disposition.GiveBack: "nack",
		disposition.Duplicate: "duplicate",
	}
	for k, s := range want {
		assert.Equal(t, s, k.String())
	}
}

func TestUnlikelyError(t *testing.T) {
	err := &decide.UnlikelyError{Evidence: decide.Evidence{ErrorType: "error", Ended: 312, Window: time.Hour}, Err: errBoom}
	assert.Equal(t, "retry_unlikely: 0 of 312 recovered in the last hour (error type error): boom", err.Error())
	assert.ErrorIs(t, err, disposition.ErrRetryUnlikely)
	assert.ErrorIs(t, err, errBoom)
	assert.Equal(t, "error", sluice.ErrorType(err), "the record keeps the handler error's type")
	assert.Equal(t, sluice.ClassRetryable, sluice.ClassOf(err), "a replay retries it as usual")
}

func TestEvidence_String(t *testing.T) {
	tests := []struct {
		window time.Duration
		want   string
	}{
		{time.Hour, "3 of 40 recovered in the last hour"},
		{30 * time.Minute, "3 of 40 recovered in the last 30m"},
		{2 * time.Hour, "3 of 40 recovered in the last 2h"},
		{90 * time.Second, "3 of 40 recovered in the last 1m30s"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			assert.Equal(t, tt.want, decide.Evidence{Recovered: 3, Ended: 40, Window: tt.window}.String())
		})
	}
}

func TestReasonOf(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{sluice.Permanent(errBoom), decide.ReasonPermanent},
		{&decide.ExhaustedError{Retries: 3, Err: errBoom}, decide.ReasonRetriesExhausted},
		{&decide.ExhaustedError{Retries: 1, Age: time.Hour, Err: errBoom}, decide.ReasonMaxAge},
		{sluice.Permanent(fmt.Errorf("%w: x", disposition.ErrDeferralExpired)), decide.ReasonDeferralExpired},
		{&decide.UnlikelyError{Err: errBoom}, decide.ReasonRetryUnlikely},
		{&decide.ShortenedError{Err: &decide.ExhaustedError{Err: errBoom}}, decide.ReasonRetryUnlikely},
		{errBoom, decide.ReasonNoDelay},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) { assert.Equal(t, tt.want, decide.ReasonOf(tt.err)) })
	}
}

// TestExplain: the sentences operators read come from the rules Decide reads, in the same
// order, with the handler's settings; a rule a handler's settings leave out is not shown.
func TestExplain(t *testing.T) {
	base := decide.View{DeadLetterQueue: "payments.dlq", MaxRetries: 5, MaxTotalAge: 24 * time.Hour, MaxRetryAfter: time.Hour,
		HandlerTimeout: 30 * time.Second, AbandonGrace: time.Second, MaxAbandoned: 16}
	cases := func(rows []decide.Row) []string {
		var out []string
		for _, r := range rows {
			out = append(out, r.Case)
		}
		return out
	}
	rows := decide.Explain(base)
	assert.Equal(t, []string{"success", "hand-off failed", "unprocessed", "consumer stopping", "permanent", "discard", "defer", "retry_after", "handler_timeout", "retryable"}, cases(rows))
	last := rows[len(rows)-1]
	assert.Equal(t, "retried after the schedule's delay, up to 5 retries (6 attempts) within 24h0m0s of the first failure; then dead-lettered to payments.dlq (retries exhausted)", last.Fate)

	full := base
	full.Breaker, full.Idempotent, full.Native = "pause", true, true
	full.Learned = &decide.Learned{MinEvidence: 50, UnlikelyBelow: 0.01, Explore: 0.05}
	full.Budget = "past the budget the delay stretches to 1m0s"
	rows = decide.Explain(full)
	assert.Equal(t, []string{"success", "hand-off failed", "breaker_open", "unprocessed", "consumer stopping", "permanent", "discard", "defer", "retry_unlikely",
		"retry_after", "handler_timeout", "still_running", "retryable"}, cases(rows))
	last = rows[len(rows)-1]
	require.True(t, strings.HasPrefix(last.Fate, "rejected back to its queue"), last.Fate)
	assert.True(t, strings.HasSuffix(last.Fate, "; past the budget the delay stretches to 1m0s"), last.Fate)
}
