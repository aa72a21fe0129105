package retrystats_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/retrystats"
)

func TestRetryEventOf(t *testing.T) {
	errT := typed("timeout")
	out := func(kind disposition.Kind, attempt int, prev string, reason error) disposition.Outcome {
		o := disposition.Outcome{Attempt: attempt, RetriedErrorType: prev, Disposition: disposition.Disposition{Kind: kind, Reason: reason}}
		if reason != nil {
			o.ErrorType = sluice.ErrorType(reason)
		}
		return o
	}
	tests := []struct {
		name     string
		o        disposition.Outcome
		want     retrystats.RetryEvent
		ok       bool
		evidence bool
	}{
		{name: "first attempt succeeded: nothing", o: out(disposition.Ack, 1, "", nil)},
		{name: "deferral: nothing", o: out(disposition.Defer, 2, "timeout", sluice.Defer(0, errT))},
		{name: "give-back: nothing", o: out(disposition.GiveBack, 2, "timeout", errT)},
		{name: "first failure retried", o: out(disposition.Retry, 1, "", errT), ok: true,
			want: retrystats.RetryEvent{ErrorType: "timeout", NewMessage: true, Retried: true, Attempt: 1}},
		{name: "same type retried again", o: out(disposition.Retry, 2, "timeout", errT), ok: true,
			want: retrystats.RetryEvent{ErrorType: "timeout", Retried: true, Resolved: "timeout", Attempt: 2}},
		{name: "recovered", o: out(disposition.Ack, 3, "timeout", nil), ok: true, evidence: true,
			want: retrystats.RetryEvent{ErrorType: "timeout", Resolved: "timeout", End: retrystats.Recovered, Attempt: 3}},
		{name: "exhausted", o: out(disposition.DeadLetter, 6, "timeout", &decide.ExhaustedError{Retries: 5, Err: errT}), ok: true, evidence: true,
			want: retrystats.RetryEvent{ErrorType: "timeout", Resolved: "timeout", End: retrystats.Exhausted, Attempt: 6}},
		{name: "permanent at once", o: out(disposition.DeadLetter, 1, "", sluice.Permanent(errT)), ok: true,
			want: retrystats.RetryEvent{ErrorType: "timeout", NewMessage: true, End: retrystats.MadePermanent, Attempt: 1}},
		{name: "deferral expired", o: out(disposition.DeadLetter, 1, "", sluice.Permanent(fmt.Errorf("%w: %w", disposition.ErrDeferralExpired, errT))), ok: true,
			want: retrystats.RetryEvent{ErrorType: "timeout", NewMessage: true, End: retrystats.DeadLettered, Attempt: 1}},
		{name: "retry unlikely", o: out(disposition.DeadLetter, 1, "", &decide.UnlikelyError{Err: errT}), ok: true,
			want: retrystats.RetryEvent{ErrorType: "timeout", NewMessage: true, End: retrystats.Unlikely, Attempt: 1}},
		{name: "discarded after a retry", o: out(disposition.Discard, 2, "timeout", sluice.Discard(errT)), ok: true, evidence: true,
			want: retrystats.RetryEvent{ErrorType: "timeout", Resolved: "timeout", End: retrystats.Discarded, Attempt: 2}},
		{name: "another type after a retry", o: out(disposition.Retry, 2, "upstream", errT), ok: true,
			want: retrystats.RetryEvent{ErrorType: "timeout", NewMessage: true, Retried: true, Resolved: "upstream", Attempt: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := retrystats.RetryEventOf(tt.o)
			assert.Equal(t, tt.ok, ok)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.evidence, got.Evidence())
		})
	}
}

func TestRetryEnd_String(t *testing.T) {
	want := map[retrystats.RetryEnd]string{
		retrystats.EndNone: "", retrystats.Recovered: "recovered", retrystats.Exhausted: "exhausted",
		retrystats.MadePermanent: "permanent", retrystats.Discarded: "discarded",
		retrystats.DeadLettered: "dead_lettered", retrystats.Unlikely: "retry_unlikely",
	}
	for e, s := range want {
		assert.Equal(t, s, e.String())
	}
}

type typed string

func (e typed) Error() string     { return string(e) }
func (e typed) ErrorType() string { return string(e) }
