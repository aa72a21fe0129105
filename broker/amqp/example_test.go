package amqp_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
)

// These examples need a RabbitMQ node; they are compiled, not run. The library reads no
// environment variable: a program passes the URL it read (sluice's commands read AMQP_URL).
const rabbitURL = "amqp://guest:guest@127.0.0.1:5672/"

// Connecting, declaring a queue with its failure paths, publishing with confirms and
// consuming. In a service, router.New(b, cfg) does the declaring and consuming.
func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{
		// Several nodes of a cluster are tried in order and failed over between.
		URLs: []string{rabbitURL},
		// Quorum queues survive the loss of a node; classic is the default.
		QueueType: amqp.QueueQuorum,
		Logger:    slog.Default(),
	})
	if err != nil {
		panic(err)
	}
	defer b.Close()

	// orders, orders.dlq behind sluice.dlx, and the route back from the delay cascade.
	if err := b.DeclareQueue(ctx, "orders"); err != nil {
		panic(err)
	}
	// Publish returns once RabbitMQ confirmed the message.
	if err := b.Publisher().Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("two books"))); err != nil {
		panic(err)
	}

	sub := b.Subscriber(broker.SubscribeOptions{Concurrency: 4, Prefetch: 16})
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		panic(err)
	}
	m := <-msgs
	fmt.Println(string(m.Payload))
	m.Ack()
}

// Delay is the retry step's hand-off: the copy waits in the delay cascade (plain queues
// with per-message TTLs, no plugin) and RabbitMQ dead-letters it back into the queue after
// exactly the delay, to DelayResolution. DeadLetter is the poison step's.
func ExampleBroker_Delay() {
	ctx := context.Background()
	b, err := amqp.Connect(ctx, rabbitURL, nil)
	if err != nil {
		panic(err)
	}
	defer b.Close()
	_ = b.DeclareQueue(ctx, "orders")

	msg := message.NewMessage(watermill.NewUUID(), []byte("retry me"))
	if err := b.Delay(ctx, "orders", 1500*time.Millisecond, msg); err != nil {
		panic(err) // returned only once RabbitMQ confirmed the copy
	}
	if err := b.DeadLetter(ctx, "orders", message.NewMessage(watermill.NewUUID(), []byte("give up"))); err != nil {
		panic(err) // orders.dlq, where `sluice dlq list --queue orders` finds it
	}
}

// Consuming sluice's queues with watermill-amqp's own subscriber, behind sluice's steps in
// a Watermill router of your own (router.Middlewares): WatermillConfig sets sluice's
// marshaler, without which retried messages (carrying RabbitMQ's x-death) would loop.
func ExampleNewWatermillSubscriber() {
	sub, err := amqp.NewWatermillSubscriber(amqp.WatermillConfig(rabbitURL), watermill.NewSlogLogger(nil))
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), "orders") // declared by sluice before
	if err != nil {
		panic(err)
	}
	for m := range msgs {
		fmt.Println(m.UUID)
		m.Ack()
	}
}
