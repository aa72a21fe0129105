package retry_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/middleware/retry"
)

// Learned.Shorten cuts a retried type's schedule to the attempt by which 99% of its
// recoveries came, only with MinShortenRecoveries of them, never below that attempt, and
// names the cut in the dead letter's reason.
func TestLearned_Shorten(t *testing.T) {
	tests := []struct {
		name           string
		shorten        bool
		at2, at3       int // evidence: messages recovering at attempt 2, at attempt 3
		wantShortenTo  int
		wantLateEndsOK bool // a message recovering at attempt 3
	}{
		{name: "off: the zero value", at2: 100, wantLateEndsOK: true},
		{name: "cut to attempt 2", shorten: true, at2: 100, wantShortenTo: 2},
		{name: "too few recoveries", shorten: true, at2: retry.MinShortenRecoveries - 1, wantLateEndsOK: true},
		{name: "never below the 99% attempt", shorten: true, at2: 98, at3: 2, wantShortenTo: 3, wantLateEndsOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLoop(t, retry.Config{Learned: &retry.Learned{MinEvidence: 20, Shorten: tt.shorten}})
			l.send("timeout", tt.at2)
			if tt.at3 > 0 {
				l.send("late", tt.at3)
			}
			v := l.r.LearnedView(handlerName, "timeout")
			assert.Equal(t, tt.wantShortenTo, v.ShortenTo, v.Reason)
			assert.False(t, v.Stopped)

			// One at a time: a late message that recovers is evidence for the next.
			late := l.send("late", 1)
			got := l.tally(late)
			if tt.wantLateEndsOK {
				assert.Equal(t, tally{succeeded: 1, calls: 3}, got)
				return
			}
			assert.Equal(t, tally{unlikely: 1, calls: 2}, got, "dead-lettered at the attempt the schedule was cut to")
			l.mu.Lock()
			reason := l.dead[late[0]]
			l.mu.Unlock()
			assert.True(t, errors.Is(reason, retry.ErrScheduleShortened))
			assert.True(t, errors.Is(reason, disposition.ErrRetriesExhausted), "the base policy's exhaustion, wrapped")
			assert.Equal(t, decide.ReasonRetryUnlikely, decide.ReasonOf(reason))
			assert.Contains(t, reason.Error(), "retry_unlikely: schedule shortened to attempt 2, by which 99% of 100 recoveries came (error type timeout; 100 of 100 recovered in the last hour)")
			assert.Equal(t, "timeout", sluice.ErrorType(reason), "the record keeps the type")
			var se *decide.ShortenedError
			require.ErrorAs(t, reason, &se)
			assert.Equal(t, 2, se.To)
		})
	}
}
