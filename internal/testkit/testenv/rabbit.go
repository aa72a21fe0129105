package testenv

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Rabbit is a plain amqp091-go client for tests: it plays the foreign producer and the
// operator who counts messages, independently of sluice's own code.
type Rabbit struct {
	t    testing.TB
	URL  string
	Conn *amqp.Connection
}

// NewRabbit connects a plain client and closes it when t ends.
func NewRabbit(t testing.TB) *Rabbit {
	t.Helper()
	u := AMQPURL(t)
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatalf("connect plain client: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &Rabbit{t: t, URL: u, Conn: conn}
}

func (r *Rabbit) channel() *amqp.Channel {
	r.t.Helper()
	ch, err := r.Conn.Channel()
	if err != nil {
		r.t.Fatalf("open channel: %v", err)
	}
	return ch
}

// Publish publishes pub to the queue named queue through the default exchange and waits
// for the broker's confirm.
func (r *Rabbit) Publish(queue string, pub amqp.Publishing) {
	r.t.Helper()
	ch := r.channel()
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		r.t.Fatalf("confirm mode: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, pub)
	if err != nil {
		r.t.Fatalf("publish to %s: %v", queue, err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil || !ok {
		r.t.Fatalf("publish to %s not confirmed: ok=%v err=%v", queue, ok, err)
	}
}

// Count returns the number of ready messages in queue (-1 if it does not exist).
func (r *Rabbit) Count(queue string) int {
	r.t.Helper()
	ch := r.channel()
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return -1
	}
	return q.Messages
}

// Get takes one message from queue (auto-ack), or ok=false when it is empty.
func (r *Rabbit) Get(queue string) (amqp.Delivery, bool) {
	r.t.Helper()
	ch := r.channel()
	defer ch.Close()
	d, ok, err := ch.Get(queue, true)
	if err != nil {
		r.t.Fatalf("get from %s: %v", queue, err)
	}
	return d, ok
}

// DeleteQueues deletes queues when t ends (and now, for leftovers of an earlier run).
func (r *Rabbit) DeleteQueues(queues ...string) {
	del := func() {
		conn, err := amqp.Dial(r.URL)
		if err != nil {
			return
		}
		defer conn.Close()
		for _, q := range queues {
			ch, err := conn.Channel()
			if err != nil {
				return
			}
			_, _ = ch.QueueDelete(q, false, false, false)
			_ = ch.Close()
		}
	}
	r.t.Cleanup(del)
}
