package disposition_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
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
		want     disposition.RetryEvent
		ok       bool
		evidence bool
	}{
		{name: "first attempt succeeded: nothing", o: out(disposition.Ack, 1, "", nil)},
		{name: "deferral: nothing", o: out(disposition.Defer, 2, "timeout", sluice.Defer(0, errT))},
		{name: "give-back: nothing", o: out(disposition.GiveBack, 2, "timeout", errT)},
		{name: "first failure retried", o: out(disposition.Retry, 1, "", errT), ok: true,
			want: disposition.RetryEvent{ErrorType: "timeout", NewMessage: true, Retried: true, Attempt: 1}},
		{name: "same type retried again", o: out(disposition.Retry, 2, "timeout", errT), ok: true,
			want: disposition.RetryEvent{ErrorType: "timeout", Retried: true, Resolved: "timeout", Attempt: 2}},
		{name: "recovered", o: out(disposition.Ack, 3, "timeout", nil), ok: true, evidence: true,
			want: disposition.RetryEvent{ErrorType: "timeout", Resolved: "timeout", End: disposition.Recovered, Attempt: 3}},
		{name: "exhausted", o: out(disposition.DeadLetter, 6, "timeout", &disposition.ExhaustedError{Retries: 5, Err: errT}), ok: true, evidence: true,
			want: disposition.RetryEvent{ErrorType: "timeout", Resolved: "timeout", End: disposition.Exhausted, Attempt: 6}},
		{name: "permanent at once", o: out(disposition.DeadLetter, 1, "", sluice.Permanent(errT)), ok: true,
			want: disposition.RetryEvent{ErrorType: "timeout", NewMessage: true, End: disposition.MadePermanent, Attempt: 1}},
		{name: "deferral expired", o: out(disposition.DeadLetter, 1, "", sluice.Permanent(fmt.Errorf("%w: %w", disposition.ErrDeferralExpired, errT))), ok: true,
			want: disposition.RetryEvent{ErrorType: "timeout", NewMessage: true, End: disposition.DeadLettered, Attempt: 1}},
		{name: "retry unlikely", o: out(disposition.DeadLetter, 1, "", &disposition.UnlikelyError{Err: errT}), ok: true,
			want: disposition.RetryEvent{ErrorType: "timeout", NewMessage: true, End: disposition.Unlikely, Attempt: 1}},
		{name: "discarded after a retry", o: out(disposition.Discard, 2, "timeout", sluice.Discard(errT)), ok: true, evidence: true,
			want: disposition.RetryEvent{ErrorType: "timeout", Resolved: "timeout", End: disposition.Discarded, Attempt: 2}},
		{name: "another type after a retry", o: out(disposition.Retry, 2, "upstream", errT), ok: true,
			want: disposition.RetryEvent{ErrorType: "timeout", NewMessage: true, Retried: true, Resolved: "upstream", Attempt: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := disposition.RetryEventOf(tt.o)
			assert.Equal(t, tt.ok, ok)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.evidence, got.Evidence())
		})
	}
}

func TestRetryEnd_String(t *testing.T) {
	want := map[disposition.RetryEnd]string{
		disposition.EndNone: "", disposition.Recovered: "recovered", disposition.Exhausted: "exhausted",
		disposition.MadePermanent: "permanent", disposition.Discarded: "discarded",
		disposition.DeadLettered: "dead_lettered", disposition.Unlikely: "retry_unlikely",
	}
	for e, s := range want {
		assert.Equal(t, s, e.String())
	}
}

type typed string

func (e typed) Error() string     { return string(e) }
func (e typed) ErrorType() string { return string(e) }
