package broker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/memory"
)

// enqueue is code written against the contract, not a broker: it declares queue with its
// failure paths, publishes msg confirmed and reports how many messages wait there.
func enqueue(ctx context.Context, b broker.Broker, queue string, msg *message.Message) (int64, error) {
	if err := b.DeclareQueue(ctx, queue); err != nil {
		return 0, fmt.Errorf("declare %s: %w", queue, err)
	}
	if err := b.PublishConfirmed(ctx, queue, msg); err != nil {
		return 0, fmt.Errorf("publish to %s: %w", queue, err)
	}
	depth, err := b.QueueDepth(ctx, queue)
	if err != nil {
		return 0, fmt.Errorf("depth of %s: %w", queue, err)
	}
	return depth.Ready, nil
}

// Code written against broker.Broker runs on either of sluice's brokers: here the
// embedded one, in production the *amqp.Broker of amqp.Connect. The optional
// capabilities are interfaces a broker has or not; the embedded broker has none of them.
func Example() {
	var b broker.Broker = memory.New(memory.Config{Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()

	ready, err := enqueue(ctx, b, "orders", message.NewMessage("o-1", []byte("two books")))
	if err != nil {
		panic(err)
	}
	fmt.Println(b.Name(), "orders ready:", ready)

	_, journals := b.(broker.Journaler)
	_, nativeRetry := b.(broker.NativeRetrier)
	fmt.Println("journaled idempotency:", journals, "native retry:", nativeRetry)

	// Everything called after Close says so with one error, whatever the broker.
	_ = b.Close()
	_, err = enqueue(ctx, b, "orders", message.NewMessage("o-2", nil))
	fmt.Println("after Close:", errors.Is(err, broker.ErrClosed))
	// Output:
	// memory orders ready: 1
	// journaled idempotency: false native retry: false
	// after Close: true
}

// A step that nacks a message says how the subscriber settles it. A message its handler
// never processed (a paused handler, a stopping consumer) is returned at once, unlike a
// failure, which is requeued after a growing pause. Without a Settle, a nack is a
// SettleReject.
func ExampleDelivery_Settle() {
	b := memory.New(memory.Config{Logger: slog.New(slog.DiscardHandler)})
	defer b.Close()
	ctx := context.Background()
	_ = b.DeclareQueue(ctx, "orders")

	sub := b.Subscriber(broker.SubscribeOptions{})
	defer sub.Close()
	msgs, _ := sub.Subscribe(ctx, "orders")
	_ = b.Publish("orders", message.NewMessage("o-1", nil))

	first := <-msgs
	d := broker.DeliveryFrom(first.Context())
	fmt.Println("before Settle:", d.Settlement() == broker.SettleReject)
	d.Settle(broker.SettleReturn) // not a failure: not counted, not paused
	first.Nack()

	again := <-msgs // the same message, redelivered at once
	fmt.Println("redelivered:", again.UUID)
	again.Ack()

	// Outside a subscriber that gives one, DeliveryFrom is nil, and safe to use.
	fmt.Println("plain context:", broker.DeliveryFrom(ctx) == nil, broker.DeliveryFrom(ctx).Settlement() == broker.SettleReject)
	// Output:
	// before Settle: true
	// redelivered: o-1
	// plain context: true true
}

// NativeRetry is the linear schedule a queue's own delayed retry carries out
// (router.WithNativeRetry): the n-th retry held back Min × n, at most Max. Validate
// refuses a schedule RabbitMQ cannot carry out, naming the value.
func ExampleNativeRetry() {
	r := broker.NativeRetry{Min: 200 * time.Millisecond, Max: 500 * time.Millisecond, MaxRetries: 4}
	fmt.Println("valid:", r.Validate() == nil)
	for n := 1; n <= r.MaxRetries; n++ {
		fmt.Printf("retry %d held back %v\n", n, r.Delay(n))
	}

	err := broker.NativeRetry{Min: 1500 * time.Microsecond, Max: time.Second}.Validate()
	fmt.Println(errors.Is(err, broker.ErrNativeRetry), err)
	// Output:
	// valid: true
	// retry 1 held back 200ms
	// retry 2 held back 400ms
	// retry 3 held back 500ms
	// retry 4 held back 500ms
	// true broker: native delayed retry refused: Min 1.5ms and Max 1s must be whole milliseconds
}
