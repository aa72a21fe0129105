package outbox_test

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/outbox"
)

// flaky stands for a broker that is unreachable while down is set.
type flaky struct {
	message.Publisher
	down atomic.Bool
}

func (f *flaky) Publish(topic string, msgs ...*message.Message) error {
	if f.down.Load() {
		return errors.New("connection refused")
	}
	return f.Publisher.Publish(topic, msgs...)
}

// The file outbox in front of a publisher: while the broker is down, Publish still
// succeeds because the messages are fsynced to a local file; once the broker is back the
// forwarder publishes them, in order, and removes each after its confirm. In production
// wrap sluice's *amqp.Publisher (or a failover.Publisher).
func Example() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	b := memory.New(memory.Config{})
	defer b.Close()
	broker := &flaky{Publisher: b.Publisher()}

	pub, err := outbox.New(broker, outbox.Config{
		Dir:              dir, // one producer process per directory
		DirectTimeout:    100 * time.Millisecond,
		RetryMaxInterval: 20 * time.Millisecond,
		Logger:           slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	defer pub.Close()

	broker.down.Store(true)
	for _, id := range []string{"o-1", "o-2"} {
		// A fresh id per message: the consumer's idempotency step recognises a copy
		// sent twice (at-least-once) by it.
		err := pub.Publish("orders", message.NewMessage(id, []byte(id)))
		fmt.Println("publish", id, "while down:", err)
	}
	fmt.Println("kept in the outbox:", pub.Stats().Kept)

	broker.down.Store(false)
	for pub.Stats().Forwarded < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	for _, m := range b.Peek("orders") {
		fmt.Println("on the broker:", m.UUID)
	}
	fmt.Println("still pending:", pub.Stats().Pending)
	// Output:
	// publish o-1 while down: <nil>
	// publish o-2 while down: <nil>
	// kept in the outbox: 2
	// on the broker: o-1
	// on the broker: o-2
	// still pending: 0
}
