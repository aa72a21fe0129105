package failover_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/failover"
)

// These examples need two RabbitMQ clusters; they are compiled, not run. The library reads
// no environment variable: a program passes the URLs it read.
const (
	primaryURL   = "amqp://guest:guest@127.0.0.1:5672/"
	secondaryURL = "amqp://guest:guest@127.0.0.2:5672/"
)

// dial connects to a cluster in the background, declaring the producer's queue once
// connected, so the producer can start while the cluster is unreachable.
func dial(url string) *failover.Cluster {
	c, err := failover.Dial(failover.ClusterConfig{
		AMQP: amqp.Config{URLs: []string{url}},
		OnConnect: func(ctx context.Context, b *amqp.Broker) error {
			return b.DeclareQueue(ctx, "orders")
		},
	})
	if err != nil {
		panic(err)
	}
	return c
}

// A producer that publishes to the secondary cluster while no node of the primary can be
// reached, and goes back to the primary as soon as it is. Success means one cluster
// confirmed the message.
func ExampleNewPublisher() {
	primary, secondary := dial(primaryURL), dial(secondaryURL)
	defer primary.Close()
	defer secondary.Close()

	pub, err := failover.NewPublisher(primary.Publisher(), secondary.Publisher(), failover.Config{})
	if err != nil {
		panic(err)
	}
	if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("two books"))); err != nil {
		panic(err)
	}
	p, s := pub.Counts()
	fmt.Println("confirmed by primary:", p, "by secondary:", s, "on secondary now:", pub.OnSecondary())
}

// A consumer of both clusters: what was published to the secondary during an outage stays
// there (the clusters share nothing), so someone must consume it.
func ExampleNewSubscriber() {
	primary, secondary := dial(primaryURL), dial(secondaryURL)
	defer primary.Close()
	defer secondary.Close()
	<-primary.Ready() // Broker is nil before the first connection
	<-secondary.Ready()

	sub := failover.NewSubscriber(
		primary.Broker().Subscriber(broker.SubscribeOptions{}),
		secondary.Broker().Subscriber(broker.SubscribeOptions{}),
	)
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), "orders")
	if err != nil {
		panic(err)
	}
	for m := range msgs {
		fmt.Println(m.UUID)
		m.Ack()
	}
}
