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
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/middleware/poison"
)

// What a dead letter holds: the message as it was (id, payload, headers) plus the failure
// record an operator reads to find the cause and replay it. Record builds the copy;
// DeadLetter publishes it, confirmed, to the queue's dead-letter queue.
func ExamplePoison_Record() {
	b := memory.New(memory.Config{})
	defer b.Close()
	p, err := poison.New(poison.Config{
		DeadLetterer: b,
		Host:         "worker-1", // recorded as x-failed-host; empty means os.Hostname()
		Now:          func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) },
	})
	if err != nil {
		panic(err)
	}

	msg := message.NewMessage("pay-7", []byte(`{"amount":-1}`))
	msg.Metadata.Set("tenant", "acme") // the producer's headers are kept
	dead := p.Record(msg, "payments", sluice.Permanent(errors.New("amount must be positive")))

	fmt.Println("id:", dead.UUID, "payload:", string(dead.Payload))
	for _, k := range []string{
		"tenant",
		sluice.HeaderErrorType,
		sluice.HeaderErrorMessage,
		sluice.HeaderOriginalQueue,
		sluice.HeaderRetryCount,
		"x-failed-at",
		"x-failed-host",
	} {
		fmt.Printf("%s: %s\n", k, dead.Metadata.Get(k))
	}
	// Output:
	// id: pay-7 payload: {"amount":-1}
	// tenant: acme
	// x-error-type: error
	// x-error-message: permanent: amount must be positive
	// x-original-queue: payments
	// x-retry-count: 0
	// x-failed-at: 2026-01-02T03:04:05Z
	// x-failed-host: worker-1
}

// The step used alone in a plain Watermill router, without the retry step: every failure
// is dead-lettered at once (there is no delay to retry through), then the message is acked,
// so the router never redelivers it.
func ExamplePoison_Middleware() {
	quiet := slog.New(slog.DiscardHandler)
	b := memory.New(memory.Config{Logger: quiet})
	defer b.Close()
	dead := make(chan poison.Event, 1)
	p, _ := poison.New(poison.Config{
		DeadLetterer: b,
		Logger:       quiet,
		OnDeadLetter: func(e poison.Event) { dead <- e }, // after the broker confirmed it
	})

	r, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	r.AddMiddleware(p.Middleware)
	r.AddConsumerHandler("ship", "orders", b.Subscriber(memory.SubscribeOptions{}), func(*message.Message) error {
		return errors.New("inventory service down")
	})
	go func() { _ = r.Run(context.Background()) }()
	defer r.Close()
	<-r.Running()

	_ = b.Publish("orders", message.NewMessage("o-1", []byte("order")))
	e := <-dead
	fmt.Println(e.MessageID, "from", e.Queue, "after", e.Retries, "retries:", e.Err)
	fmt.Println("in orders.dlq:", b.Peek("orders.dlq")[0].UUID)
	// Output:
	// o-1 from orders after 0 retries: inventory service down
	// in orders.dlq: o-1
}
