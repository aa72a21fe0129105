package router_test

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
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// A stack on the embedded broker with every step: retry, poison (always there: the
// stack's DLQ), a circuit breaker and idempotency. The handler fails once and then
// succeeds; a duplicate of the same message is then acked without calling it.
func Example() {
	quiet := slog.New(slog.DiscardHandler)
	b := memory.New(memory.Config{Logger: quiet}) // swap for amqp.Connect in production
	defer b.Close()

	duplicates := make(chan string, 1)

	s, err := router.New(b, router.Config{
		Logger: quiet,
		// Short delays for the example; the retry itself is a broker-side delay,
		// the handler goroutine never sleeps.
		Retry:   retry.Config{MaxRetries: 3, InitialDelay: 20 * time.Millisecond, Jitter: retry.NoJitter},
		Breaker: &breaker.Config{ConsecutiveFailures: 5, Logger: quiet},
		Idempotency: &idempotency.Config{
			OnDuplicate: func(msg *message.Message, key string) { duplicates <- key },
		},
	})
	if err != nil {
		panic(err)
	}
	succeeded := make(chan struct{})
	err = s.Handle("charge", "payments", func(msg *message.Message) error {
		attempt := sluice.RetryCount(msg.Metadata) + 1
		fmt.Printf("attempt %d of %s\n", attempt, msg.UUID)
		if attempt == 1 {
			return errors.New("gateway timeout") // a plain error is retryable
		}
		close(succeeded)
		return nil
	})
	if err != nil {
		panic(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Run(ctx) }()
	<-s.Running()

	_ = b.Publish("payments", message.NewMessage("pay-1", []byte(`{"amount":42}`)))
	<-succeeded
	// The same message id again: the idempotency step acks it, the handler is not called.
	_ = b.Publish("payments", message.NewMessage("pay-1", []byte(`{"amount":42}`)))
	fmt.Println("duplicate acked:", <-duplicates)

	_ = s.Close()
	fmt.Println("breaker:", s.Describe().Breakers[0].State)
	fmt.Println("dead letters:", b.Len("payments.dlq"))
	// Output:
	// attempt 1 of pay-1
	// attempt 2 of pay-1
	// duplicate acked: pay-1
	// breaker: closed
	// dead letters: 0
}

// sluice's steps in a Watermill router of your own, in the stack's order. The queue must
// be declared with sluice's topology, so that retries and dead letters have somewhere to go.
func ExampleMiddlewares() {
	quiet := slog.New(slog.DiscardHandler)
	b := memory.New(memory.Config{Logger: quiet})
	defer b.Close()
	_ = b.DeclareQueue(context.Background(), "payments")

	mws, closeSteps, err := router.Middlewares(b, router.Config{
		Logger: quiet,
		Retry:  retry.Config{MaxRetries: 1, InitialDelay: 10 * time.Millisecond, Jitter: retry.NoJitter},
	})
	if err != nil {
		panic(err)
	}
	defer closeSteps() // once the router using the steps is closed

	r, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	r.AddMiddleware(mws...)
	r.AddConsumerHandler("charge", "payments", b.Subscriber(broker.SubscribeOptions{}), func(msg *message.Message) error {
		fmt.Println("attempt", sluice.RetryCount(msg.Metadata)+1)
		return errors.New("gateway timeout")
	})
	go func() { _ = r.Run(context.Background()) }()
	defer r.Close()
	<-r.Running()

	_ = b.Publish("payments", message.NewMessage("pay-1", nil))
	for b.Len("payments.dlq") == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	dead := b.Peek("payments.dlq")[0]
	fmt.Println("dead-lettered:", dead.UUID, dead.Metadata.Get(sluice.HeaderErrorMessage))
	// Output:
	// attempt 1
	// attempt 2
	// dead-lettered: pay-1 retries exhausted after 1 retries: gateway timeout
}

// Describe is the retry decision matrix in force, for a runbook (Markdown) or a tool
// (JSON, PolicyHandler): here, each retry's delay and when it comes after the first failure.
func ExampleStack_Describe() {
	quiet := slog.New(slog.DiscardHandler)
	b := memory.New(memory.Config{Logger: quiet})
	defer b.Close()
	s, _ := router.New(b, router.Config{
		Logger: quiet,
		Retry:  retry.Config{MaxRetries: 3, InitialDelay: time.Second, Multiplier: 2, Jitter: retry.NoJitter},
	})
	_ = s.Handle("charge", "payments", func(*message.Message) error { return nil })

	h := s.Describe().Handlers[0]
	fmt.Println(h.Name, "consumes", h.Queue, "dead letters to", h.DeadLetterQueue)
	for _, r := range h.Retry.Schedule {
		fmt.Printf("retry %d (attempt %d): after %v, %v after the first failure\n", r.Retry, r.Attempt, r.Delay, r.Elapsed)
	}
	// Output:
	// charge consumes payments dead letters to payments.dlq
	// retry 1 (attempt 2): after 1s, 1s after the first failure
	// retry 2 (attempt 3): after 2s, 3s after the first failure
	// retry 3 (attempt 4): after 4s, 7s after the first failure
}

// A handler whose retries the queue carries itself: on RabbitMQ 4.3 with quorum queues
// (amqp.Config{QueueType: amqp.QueueQuorum}), a failed attempt is rejected and held back
// 200 ms × its retry number, at most 5 s, with nothing published to the delay cascade.
// The embedded broker has no native delayed retry, so there Handle refuses the option.
func ExampleWithNativeRetry() {
	quiet := slog.New(slog.DiscardHandler)
	b := memory.New(memory.Config{Logger: quiet})
	defer b.Close()
	s, err := router.New(b, router.Config{Logger: quiet})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	charge := func(*message.Message) error { return errors.New("gateway: 503") }
	err = s.Handle("payments", "payments", charge, router.WithNativeRetry(200*time.Millisecond, 5*time.Second))
	fmt.Println(errors.Is(err, router.ErrInvalidOption))
	// Output: true
}

// A saga's compensation: when a payment finally fails, the payments handler publishes a
// payment.failed event, confirmed with the dead letter before the ack, and the orders
// handler cancels the order. The event's id is derived from the payment's id, the same on
// every redelivery, so the orders side deduplicates by it.
func ExampleWithCompensation() {
	quiet := slog.New(slog.DiscardHandler)
	b := memory.New(memory.Config{Logger: quiet})
	defer b.Close()
	s, err := router.New(b, router.Config{Logger: quiet, Retry: retry.Config{MaxRetries: 2, InitialDelay: 10 * time.Millisecond}})
	if err != nil {
		panic(err)
	}
	charge := func(*message.Message) error { return sluice.Permanent(errors.New("card declined")) }
	paymentFailed := router.Compensation{
		Queue: "payments.failed", // or Exchange and RoutingKey
		Build: func(payment, record *message.Message) (*message.Message, error) {
			// record is the dead letter: its failure record says why.
			why := record.Metadata.Get(sluice.HeaderErrorMessage)
			return message.NewMessage("", []byte(`{"order":"`+string(payment.Payload)+`","reason":"`+why+`"}`)), nil
		},
	}
	if err := s.Handle("payments", "payments", charge, router.WithCompensation(paymentFailed)); err != nil {
		panic(err)
	}
	cancelled := make(chan string, 1)
	seen := map[string]bool{} // deduplicate by the event's id: delivered at least once
	cancelOrder := func(ev *message.Message) error {
		if !seen[ev.UUID] {
			seen[ev.UUID] = true
			cancelled <- string(ev.Payload)
		}
		return nil
	}
	if err := s.Handle("orders", "payments.failed", cancelOrder, router.WithConcurrency(1)); err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Run(ctx) }()
	<-s.Running()
	_ = b.Publish("payments", message.NewMessage("pay-1", []byte("42")))
	fmt.Println(<-cancelled)
	_ = s.Close()
	// Output: {"order":"42","reason":"permanent: card declined"}
}
