// Command send publishes one payment request the way a producer outside sluice would: a
// persistent JSON message on the topic exchange orders with the key payment.requested,
// confirmed by RabbitMQ (AMQP_URL, default amqp://guest:guest@localhost:5672/). The
// quickstart consumes it:
//
//	go run ./examples/quickstart/send '{"payment_id":"pay_1","amount_cents":1299}'
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/internal/mask"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, `usage: send '{"payment_id":"pay_1","amount_cents":1299}'`)
		os.Exit(2)
	}
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@localhost:5672/"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := fmt.Sprintf("send-%d", time.Now().UnixNano())
	if err := send(ctx, url, "orders", "payment.requested", id, []byte(os.Args[1])); err != nil {
		fmt.Fprintln(os.Stderr, "send:", err)
		os.Exit(1)
	}
	fmt.Printf("sent message %s to exchange orders (payment.requested)\n", id)
}

// errUnrouted says no queue is bound for the key yet: the quickstart declares its queue
// and binding when it starts.
var errUnrouted = errors.New("no queue is bound for it (start the quickstart first)")

// send publishes body to exchange with key, mandatory and confirmed, and returns once
// RabbitMQ confirmed it or said why not.
func send(ctx context.Context, url, exchange, key, id string, body []byte) error {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ at %s: %w", mask.URL(url), err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("enable publisher confirms: %w", err)
	}
	returned := ch.NotifyReturn(make(chan amqp091.Return, 1))
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, amqp091.Publishing{
		MessageId: id, ContentType: "application/json", DeliveryMode: amqp091.Persistent, Timestamp: time.Now(), Body: body,
	})
	if err != nil {
		return fmt.Errorf("publish to exchange %q: %w", exchange, err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("wait for RabbitMQ's confirm: %w", err)
	}
	select {
	case r := <-returned: // a return arrives before its confirm
		return fmt.Errorf("exchange %q returned the message (%s): %w", exchange, r.ReplyText, errUnrouted)
	default:
	}
	if !ok {
		return fmt.Errorf("RabbitMQ refused the message (nack) on exchange %q", exchange)
	}
	return nil
}
