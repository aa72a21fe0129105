package poison_test

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
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/middleware/poison"
)

// The step used alone in a plain Watermill router, without the retry step: every failure
// is dead-lettered at once (there is no delay to retry through), with its failure record,
// then the message is acked, so the router never redelivers it.
func ExampleMiddleware() {
	quiet := slog.New(slog.DiscardHandler)
	b := memory.New(memory.Config{Logger: quiet})
	defer b.Close()
	dead := make(chan disposition.Outcome, 1)
	mw, err := poison.Middleware(poison.Config{
		DeadLetterer: b,
		Logger:       quiet,
		Host:         "worker-1", // recorded as x-failed-host; empty means os.Hostname()
		Now:          func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) },
		// Told every outcome, a dead letter once the broker confirmed it.
		Observer: disposition.ObserverFunc(func(_ context.Context, o disposition.Outcome) {
			if o.Disposition.Kind == disposition.DeadLetter {
				dead <- o
			}
		}),
	})
	if err != nil {
		panic(err)
	}

	r, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	r.AddMiddleware(mw)
	r.AddConsumerHandler("ship", "orders", b.Subscriber(broker.SubscribeOptions{}), func(*message.Message) error {
		return sluice.Permanent(errors.New("amount must be positive"))
	})
	go func() { _ = r.Run(context.Background()) }()
	defer r.Close()
	<-r.Running()

	msg := message.NewMessage("o-1", []byte(`{"amount":-1}`))
	msg.Metadata.Set("tenant", "acme") // the producer's headers are kept
	_ = b.Publish("orders", msg)
	o := <-dead
	fmt.Println(o.MessageID, "from", o.Queue, "at attempt", o.Attempt, "error type", o.ErrorType)

	rec := b.Peek("orders.dlq")[0]
	fmt.Println("id:", rec.UUID, "payload:", string(rec.Payload))
	for _, k := range []string{"tenant", "x-error-type", "x-error-message", "x-dead-letter-reason", "x-original-queue",
		"x-retry-count", "x-handler", "x-failed-at", "x-failed-host"} {
		fmt.Printf("%s: %s\n", k, rec.Metadata.Get(k))
	}
	// Output:
	// o-1 from orders at attempt 1 error type error
	// id: o-1 payload: {"amount":-1}
	// tenant: acme
	// x-error-type: error
	// x-error-message: permanent: amount must be positive
	// x-dead-letter-reason: permanent
	// x-original-queue: orders
	// x-retry-count: 0
	// x-handler: ship
	// x-failed-at: 2026-01-02T03:04:05Z
	// x-failed-host: worker-1
}
