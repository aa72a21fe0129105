package memory_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/memory"
)

// The embedded broker as a Watermill pub/sub: a queue, a subscriber, an ack. It is what
// router.New runs on in demos and tests (no RabbitMQ); nothing survives the process.
func Example() {
	b := memory.New(memory.Config{Logger: slog.New(slog.DiscardHandler)})
	defer b.Close()
	ctx := context.Background()
	_ = b.DeclareQueue(ctx, "orders") // and its dead-letter queue, orders.dlq

	sub := b.Subscriber(broker.SubscribeOptions{Concurrency: 1})
	defer sub.Close()
	msgs, _ := sub.Subscribe(ctx, "orders")

	_ = b.Publish("orders", message.NewMessage("o-1", []byte("two books")))
	m := <-msgs
	fmt.Println("received", m.UUID, string(m.Payload))
	m.Ack() // a Nack would requeue it, as RabbitMQ does

	// A dead letter goes to the queue's DLQ, where it waits for an operator.
	_ = b.DeadLetter(ctx, "orders", message.NewMessage("o-2", []byte("bad")))
	fmt.Println("orders.dlq holds", b.Len("orders.dlq"))
	// Output:
	// received o-1 two books
	// orders.dlq holds 1
}

// Delay is what the retry step hands a failed message to: the scheduler delivers the copy
// after the delay, and no goroutine sleeps per message meanwhile.
func ExampleBroker_Delay() {
	b := memory.New(memory.Config{})
	defer b.Close()
	ctx := context.Background()

	_ = b.Delay(ctx, "orders", 50*time.Millisecond, message.NewMessage("o-1", nil))
	// Len counts scheduled messages; QueueDepth only the ready ones.
	depth, _ := b.QueueDepth(ctx, "orders")
	fmt.Println("waiting:", b.Len("orders"), "ready:", depth.Ready)

	for depth.Ready == 0 { // ready about 50ms later
		time.Sleep(10 * time.Millisecond)
		depth, _ = b.QueueDepth(ctx, "orders")
	}
	fmt.Println("waiting:", b.Len("orders"), "ready:", depth.Ready)
	// Output:
	// waiting: 1 ready: 0
	// waiting: 1 ready: 1
}

// Publish/subscribe: each subscriber has its own queue bound to the exchange, and gets its
// own copy of every event whose routing key matches its binding.
func ExampleBroker_PublishToExchange() {
	b := memory.New(memory.Config{})
	defer b.Close()
	ctx := context.Background()
	_ = b.DeclareSubscription(ctx, "billing", []broker.Binding{{Exchange: "orders", Keys: []string{"order.*"}}}, false)
	_ = b.DeclareSubscription(ctx, "audit", []broker.Binding{{Exchange: "orders", Keys: []string{"#"}}}, false)

	_ = b.PublishToExchange(ctx, "orders", "order.created", message.NewMessage("e-1", nil))
	_ = b.PublishToExchange(ctx, "orders", "refund.issued", message.NewMessage("e-2", nil))
	fmt.Println("billing:", b.Len("billing"), "audit:", b.Len("audit"))
	// Output:
	// billing: 1 audit: 2
}
