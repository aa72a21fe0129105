package retrystats_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/retrystats"
)

// Stats counts how retried messages ended, per handler and error type. In a service it is
// retry.Config.Stats and sees every attempt; here it is fed the outcomes of two messages
// by hand: pay-1 recovers on its second attempt, pay-2 is dead-lettered after two retries.
func ExampleStats() {
	stats, err := retrystats.New(retrystats.Config{Window: time.Hour})
	if err != nil {
		panic(err)
	}
	timeout := errors.New("gateway timeout")
	retry := disposition.Disposition{Kind: disposition.Retry, Delay: time.Second, Reason: timeout}
	exhausted := disposition.Disposition{
		Kind:   disposition.DeadLetter,
		Reason: &decide.ExhaustedError{Retries: 2, Made: 3, Err: timeout},
	}
	outcome := func(id string, attempt int, d disposition.Disposition) disposition.Outcome {
		o := disposition.Outcome{Disposition: d, Attempt: attempt, Handler: "charge", MessageID: id}
		if d.Kind != disposition.Ack {
			o.ErrorType = "gateway_timeout"
		}
		if attempt > 1 {
			o.RetriedErrorType = "gateway_timeout" // the x-last-error the attempt arrived with
		}
		return o
	}
	ctx := context.Background()
	for _, o := range []disposition.Outcome{
		outcome("pay-1", 1, retry),
		outcome("pay-1", 2, disposition.Disposition{Kind: disposition.Ack}),
		outcome("pay-2", 1, retry),
		outcome("pay-2", 2, retry),
		outcome("pay-2", 3, exhausted),
	} {
		stats.Observe(ctx, o)
	}

	t := stats.Type("charge", "gateway_timeout")
	fmt.Println("messages failed:", t.Messages, "retries:", t.Retries)
	fmt.Println("recovered:", t.Recovered, "exhausted:", t.Exhausted, "ended:", t.Ended)
	fmt.Printf("recovery rate: %.0f%%, median recovery attempt: %d\n", 100*t.RecoveryRate(), t.RecoveryAttempt(0.5))
	fmt.Println("evidence:", t.Evidence())
	// Output:
	// messages failed: 2 retries: 3
	// recovered: 1 exhausted: 1 ended: 2
	// recovery rate: 50%, median recovery attempt: 2
	// evidence: 1 of 2 recovered in the last hour
}
