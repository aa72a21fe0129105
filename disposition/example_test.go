package disposition_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// An observer of the retry step sees every attempt's outcome once, after the hand-off it
// made was confirmed: here a handler that keeps failing, retried once through the broker's
// delay, then dead-lettered because its retries ran out.
func ExampleObserverFunc() {
	quiet := slog.New(slog.DiscardHandler)
	b := memory.New(memory.Config{Logger: quiet})
	defer b.Close()

	outcomes := make(chan disposition.Outcome, 2)
	s, err := router.New(b, router.Config{
		Logger: quiet,
		Retry: retry.Config{
			MaxRetries: 1, InitialDelay: 10 * time.Millisecond, Jitter: retry.NoJitter,
			Observer: disposition.ObserverFunc(func(_ context.Context, o disposition.Outcome) {
				outcomes <- o // quick: it runs on the handler's goroutine
			}),
		},
	})
	if err != nil {
		panic(err)
	}
	if err := s.Handle("charge", "payments", func(*message.Message) error {
		return errors.New("gateway timeout")
	}); err != nil {
		panic(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Run(ctx) }()
	<-s.Running()
	_ = b.Publish("payments", message.NewMessage("pay-1", nil))

	for range 2 {
		o := <-outcomes
		d := o.Disposition
		fmt.Printf("%s attempt %d: %s after %v (%s)\n", o.MessageID, o.Attempt, d.Kind, d.Delay, d.Reason)
		if d.Kind == disposition.DeadLetter {
			fmt.Println("retries exhausted:", errors.Is(d.Reason, disposition.ErrRetriesExhausted))
		}
	}
	_ = s.Close()
	// Output:
	// pay-1 attempt 1: retry after 10ms (gateway timeout)
	// pay-1 attempt 2: dead_letter after 0s (retries exhausted after 1 retries: gateway timeout)
	// retries exhausted: true
}
