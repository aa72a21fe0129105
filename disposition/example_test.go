package disposition_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
)

// Decide is sluice's whole decision table as a plain function: no clock, no context, no
// broker. The retry step calls it once per failed attempt and carries the result out.
func ExampleDecide() {
	policy := disposition.Policy{
		MaxRetries:    3,
		MaxTotalAge:   24 * time.Hour,
		MaxRetryAfter: time.Hour,
		Backoff:       func(n int) time.Duration { return time.Second << (n - 1) }, // 1s, 2s, 4s
	}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	first := disposition.History{Retries: 0, Now: now}
	// The fourth attempt: three retries made since the first failure, ten minutes ago.
	last := disposition.History{Retries: 3, FirstFailure: now.Add(-10 * time.Minute), Now: now}

	timeout := errors.New("gateway timeout")
	for _, c := range []struct {
		name string
		h    disposition.History
		err  error
	}{
		{"success", first, nil},
		{"plain error", first, timeout},
		{"plain error, retries used up", last, timeout},
		{"RetryAfter", first, sluice.RetryAfter(30*time.Second, timeout)},
		{"Permanent", first, sluice.Permanent(errors.New("invalid card"))},
		{"Discard", first, sluice.Discard(errors.New("stale event"))},
		{"Defer", first, sluice.Defer(5*time.Minute, errors.New("not open yet"))},
	} {
		d := disposition.Decide(policy, c.h, c.err)
		fmt.Printf("%-29s %-11s delay=%v\n", c.name, d.Kind, d.Delay)
		if errors.Is(d.Reason, disposition.ErrRetriesExhausted) {
			fmt.Println("  reason:", d.Reason)
		}
	}
	// Output:
	// success                       ack         delay=0s
	// plain error                   retry       delay=1s
	// plain error, retries used up  dead_letter delay=0s
	//   reason: retries exhausted after 3 retries: gateway timeout
	// RetryAfter                    retry       delay=30s
	// Permanent                     dead_letter delay=0s
	// Discard                       discard     delay=0s
	// Defer                         deferred    delay=5m0s
}
