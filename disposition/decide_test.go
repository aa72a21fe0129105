package disposition_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
)

var errBoom = errors.New("boom")

func TestDecide(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	policy := disposition.Policy{
		MaxRetries: 3, MaxTotalAge: time.Hour, MaxRetryAfter: time.Minute,
		Backoff: func(n int) time.Duration { return time.Duration(n) * time.Second },
	}
	giveBack := disposition.GiveBackError(errBoom)
	evidence := disposition.Evidence{ErrorType: "error", Recovered: 0, Ended: 312, Window: time.Hour}
	tests := []struct {
		name   string
		policy func(*disposition.Policy)
		hist   disposition.History
		err    error
		want   disposition.Kind
		delay  time.Duration
		is     error // the reason matches it
	}{
		{name: "success", err: nil, want: disposition.Ack},
		{name: "first failure", err: errBoom, want: disposition.Retry, delay: time.Second, is: errBoom},
		{name: "third failure", hist: disposition.History{Retries: 2}, err: errBoom, want: disposition.Retry, delay: 3 * time.Second, is: errBoom},
		{name: "retries used up", hist: disposition.History{Retries: 3}, err: errBoom, want: disposition.DeadLetter, is: disposition.ErrRetriesExhausted},
		{name: "older than MaxTotalAge", hist: disposition.History{Retries: 1, FirstFailure: now.Add(-2 * time.Hour)}, err: errBoom, want: disposition.DeadLetter, is: disposition.ErrRetriesExhausted},
		{name: "RetryAfter", err: sluice.RetryAfter(7*time.Second, errBoom), want: disposition.Retry, delay: 7 * time.Second, is: errBoom},
		{name: "RetryAfter capped", err: sluice.RetryAfter(time.Hour, errBoom), want: disposition.Retry, delay: time.Minute, is: errBoom},
		{name: "Permanent", err: sluice.Permanent(errBoom), want: disposition.DeadLetter, is: errBoom},
		{name: "Discard", err: sluice.Discard(errBoom), want: disposition.Discard, is: errBoom},
		{name: "Defer", err: sluice.Defer(5*time.Second, errBoom), want: disposition.Defer, delay: 5 * time.Second, is: errBoom},
		{name: "Defer capped", err: sluice.Defer(time.Hour, errBoom), want: disposition.Defer, delay: time.Minute, is: errBoom},
		{name: "Defer uses no attempt", hist: disposition.History{Retries: 3}, err: sluice.Defer(time.Second, errBoom), want: disposition.Defer, delay: time.Second},
		{name: "Defer expired", hist: disposition.History{FirstDefer: now.Add(-2 * time.Hour)}, err: sluice.Defer(time.Second, errBoom), want: disposition.DeadLetter, is: disposition.ErrDeferralExpired},
		{name: "an inner step's give-back", err: giveBack, want: disposition.GiveBack, is: errBoom},
		{name: "an inner step's give-back, wrapped", err: fmt.Errorf("step: %w", giveBack), want: disposition.GiveBack, is: errBoom},
		{name: "no delay: retryable dead-lettered at once", policy: func(p *disposition.Policy) { p.NoDelay = true }, err: errBoom, want: disposition.DeadLetter, is: errBoom},
		{name: "no delay: Defer dead-lettered at once", policy: func(p *disposition.Policy) { p.NoDelay = true }, err: sluice.Defer(time.Second, errBoom), want: disposition.DeadLetter, is: errBoom},
		{name: "unlikely: a retryable failure dead-lettered at once", policy: func(p *disposition.Policy) { p.Unlikely = &evidence }, err: errBoom, want: disposition.DeadLetter, is: disposition.ErrRetryUnlikely},
		{name: "unlikely: RetryAfter dead-lettered at once", policy: func(p *disposition.Policy) { p.Unlikely = &evidence }, err: sluice.RetryAfter(time.Second, errBoom), want: disposition.DeadLetter, is: disposition.ErrRetryUnlikely},
		{name: "unlikely: Permanent stays Permanent", policy: func(p *disposition.Policy) { p.Unlikely = &evidence }, err: sluice.Permanent(errBoom), want: disposition.DeadLetter, is: errBoom},
		{name: "unlikely: Discard still acked", policy: func(p *disposition.Policy) { p.Unlikely = &evidence }, err: sluice.Discard(errBoom), want: disposition.Discard},
		{name: "unlikely: Defer still deferred", policy: func(p *disposition.Policy) { p.Unlikely = &evidence }, err: sluice.Defer(time.Second, errBoom), want: disposition.Defer, delay: time.Second},
		{name: "unlikely: an inner step's give-back unchanged", policy: func(p *disposition.Policy) { p.Unlikely = &evidence }, err: giveBack, want: disposition.GiveBack, is: errBoom},
		{name: "no delay: Discard still acked", policy: func(p *disposition.Policy) { p.NoDelay = true }, err: sluice.Discard(errBoom), want: disposition.Discard},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := policy
			if tt.policy != nil {
				tt.policy(&p)
			}
			tt.hist.Now = now
			d := disposition.Decide(p, tt.hist, tt.err)
			assert.Equal(t, tt.want, d.Kind, "%v", d.Reason)
			assert.Equal(t, tt.delay, d.Delay)
			if tt.err == nil {
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

func TestGiveBackError(t *testing.T) {
	assert.NoError(t, disposition.GiveBackError(nil))
	err := disposition.GiveBackError(errBoom)
	assert.True(t, disposition.IsGiveBack(err))
	assert.ErrorIs(t, err, errBoom)
	assert.False(t, disposition.IsGiveBack(errBoom))
	assert.Equal(t, sluice.ClassRetryable, sluice.ClassOf(err))
	assert.Equal(t, sluice.ErrorTypeGeneric, sluice.ErrorType(err), "the give-back adds no type of its own")
}

func TestUnlikelyError(t *testing.T) {
	err := &disposition.UnlikelyError{Evidence: disposition.Evidence{ErrorType: "error", Ended: 312, Window: time.Hour}, Err: errBoom}
	assert.Equal(t, "retry_unlikely: 0 of 312 recovered in the last hour (error type error): boom", err.Error())
	assert.ErrorIs(t, err, disposition.ErrRetryUnlikely)
	assert.ErrorIs(t, err, errBoom)
	assert.Equal(t, sluice.ErrorTypeGeneric, sluice.ErrorType(err), "the record keeps the handler error's type")
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
			assert.Equal(t, tt.want, disposition.Evidence{Recovered: 3, Ended: 40, Window: tt.window}.String())
		})
	}
}
