package disposition_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
)

// budgetRefusal names its own reason, as the retry step's budget refusal does.
type budgetRefusal struct{ error }

func (budgetRefusal) DeadLetterReason() string { return "retry_budget_exhausted" }

// The reason a dead letter's record gives is derived from the decision that sent it there:
// every way Decide dead-letters has its own reason.
func TestDeadLetterReasonOf(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	policy := disposition.Policy{MaxRetries: 3, MaxTotalAge: time.Hour, MaxRetryAfter: time.Minute}
	evidence := disposition.Evidence{ErrorType: "upstream_broken", Ended: 40, Window: time.Hour}
	tests := []struct {
		name   string
		policy func(*disposition.Policy)
		hist   disposition.History
		err    error
		want   string
	}{
		{name: "permanent", err: sluice.Permanent(errBoom), want: disposition.ReasonPermanent},
		{name: "retries used up", hist: disposition.History{Retries: 3, Now: now}, err: errBoom, want: disposition.ReasonRetriesExhausted},
		{name: "older than MaxTotalAge", hist: disposition.History{Retries: 1, Now: now, FirstFailure: now.Add(-2 * time.Hour)},
			err: errBoom, want: disposition.ReasonMaxAge},
		{name: "deferred past MaxTotalAge", hist: disposition.History{Now: now, FirstDefer: now.Add(-2 * time.Hour)},
			err: sluice.Defer(time.Second, errBoom), want: disposition.ReasonDeferralExpired},
		{name: "learned policy", policy: func(p *disposition.Policy) { p.Unlikely = &evidence },
			hist: disposition.History{Now: now}, err: errBoom, want: disposition.ReasonRetryUnlikely},
		{name: "no broker delay", policy: func(p *disposition.Policy) { p.NoDelay = true },
			hist: disposition.History{Now: now}, err: errBoom, want: disposition.ReasonNoDelay},
		{name: "an inner step's own decision", hist: disposition.History{Now: now},
			err:  disposition.Return(disposition.Disposition{Kind: disposition.DeadLetter, Reason: sluice.Discard(errBoom)}),
			want: disposition.ReasonFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := policy
			if tt.policy != nil {
				tt.policy(&p)
			}
			d := disposition.Decide(p, tt.hist, tt.err)
			require.Equal(t, disposition.DeadLetter, d.Kind)
			assert.Equal(t, tt.want, disposition.DeadLetterReasonOf(d.Reason))
		})
	}

	t.Run("an error naming its own reason", func(t *testing.T) {
		err := fmt.Errorf("retry refused: %w", budgetRefusal{errBoom})
		assert.Equal(t, "retry_budget_exhausted", disposition.DeadLetterReasonOf(err))
	})
}
