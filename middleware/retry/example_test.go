package retry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/middleware/retry"
)

// The retry step used alone in a plain Watermill router. The embedded broker is the
// subscriber, the delay (retries come back through it, not through a sleeping handler)
// and the dead-letter queue.
func Example() {
	quiet := slog.New(slog.DiscardHandler)
	b := memory.New(memory.Config{Logger: quiet})
	defer b.Close()
	_ = b.DeclareQueue(context.Background(), "orders") // orders and orders.dlq

	r, err := retry.New(retry.Config{
		Delayer:      b, // the broker's delay
		DeadLetterer: b, // and its dead-letter queue
		MaxRetries:   2,
		InitialDelay: 10 * time.Millisecond,
		Jitter:       retry.NoJitter,
		Logger:       quiet,
	})
	if err != nil {
		panic(err)
	}

	wr, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	wr.AddMiddleware(r.Middleware)
	wr.AddConsumerHandler("ship", "orders", b.Subscriber(broker.SubscribeOptions{}), func(msg *message.Message) error {
		fmt.Println("attempt", sluice.RetryCount(msg.Metadata)+1)
		if string(msg.Payload) == "declined" {
			return sluice.Permanent(errors.New("card declined")) // never retried
		}
		return errors.New("warehouse unavailable") // retryable: 1 attempt + 2 retries
	})
	go func() { _ = wr.Run(context.Background()) }()
	defer wr.Close()
	<-wr.Running()

	_ = b.Publish("orders", message.NewMessage("o-1", []byte("flaky")))
	for b.Len("orders.dlq") < 1 {
		time.Sleep(5 * time.Millisecond)
	}
	_ = b.Publish("orders", message.NewMessage("o-2", []byte("declined")))
	for b.Len("orders.dlq") < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	for _, dead := range b.Peek("orders.dlq") {
		fmt.Println(dead.UUID, dead.Metadata.Get(sluice.HeaderRetryCount), dead.Metadata.Get(sluice.HeaderErrorMessage))
	}
	// Output:
	// attempt 1
	// attempt 2
	// attempt 3
	// attempt 1
	// o-1 2 retries exhausted after 2 retries: warehouse unavailable
	// o-2 0 permanent: card declined
}

// A policy's delays: InitialDelay grown by Multiplier, capped at MaxDelay. NoJitter makes
// them exact; in production keep some jitter so that retries of a burst spread out.
func ExampleRetry_Backoff() {
	b := memory.New(memory.Config{})
	defer b.Close()
	r, err := retry.New(retry.Config{
		Delayer:      b,
		DeadLetterer: b,
		MaxRetries:   5,
		InitialDelay: time.Second,
		Multiplier:   3,
		MaxDelay:     time.Minute,
		Jitter:       retry.NoJitter,
	})
	if err != nil {
		panic(err)
	}
	for n := 1; n <= r.Config().MaxRetries; n++ {
		fmt.Printf("retry %d after %v\n", n, r.Backoff(n))
	}
	// Output:
	// retry 1 after 1s
	// retry 2 after 3s
	// retry 3 after 9s
	// retry 4 after 27s
	// retry 5 after 1m0s
}
