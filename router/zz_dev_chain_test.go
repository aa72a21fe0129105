package router_test

import (
	"fmt"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/internal/testenv"
)

func TestDevChain(t *testing.T) {
	r := testenv.NewRabbit(t)
	ch, _ := r.Conn.Channel()
	q := testenv.Name("dev.chain")
	r.DeleteQueues(q)
	ch.QueueDeclare(q, true, false, false, false, nil)
	const levels = 26
	name := func(kind string, k int) string { return fmt.Sprintf("dev.chain.%s.%02d", kind, k) }
	defer func() {
		for _, kind := range []string{"headers", "direct", "topic"} {
			for k := 0; k < levels; k++ {
				ch.ExchangeDelete(name(kind, k), false, false)
			}
		}
	}()
	// headers: level k -> level k-1 when bit-k = 0; level 0 -> queue
	for k := 0; k < levels; k++ {
		ch.ExchangeDeclare(name("headers", k), "headers", false, true, false, false, nil)
		ch.ExchangeDeclare(name("direct", k), "direct", false, true, false, false, nil)
		ch.ExchangeDeclare(name("topic", k), "topic", false, true, false, false, nil)
	}
	for k := 0; k < levels; k++ {
		args := amqp091.Table{"x-match": "all", fmt.Sprintf("d%02d", k): "0"}
		if k == 0 {
			if err := ch.QueueBind(q, "", name("headers", 0), false, args); err != nil {
				t.Fatal(err)
			}
			ch.QueueBind(q, q, name("direct", 0), false, nil)
			ch.QueueBind(q, "#."+q, name("topic", 0), false, nil)
			continue
		}
		if err := ch.ExchangeBind(name("headers", k-1), "", name("headers", k), false, args); err != nil {
			t.Fatal(err)
		}
		ch.ExchangeBind(name("direct", k-1), q, name("direct", k), false, nil)
		ch.ExchangeBind(name("topic", k-1), "#", name("topic", k), false, nil)
	}
	ch.Confirm(false)
	hdr := amqp091.Table{}
	for k := 0; k < levels; k++ {
		hdr[fmt.Sprintf("d%02d", k)] = "0"
	}
	for _, kind := range []string{"headers", "direct", "topic", "headers", "direct", "topic"} {
		start := time.Now()
		var dcs []*amqp091.DeferredConfirmation
		n := 2000
		for i := 0; i < n; i++ {
			dc, err := ch.PublishWithDeferredConfirm(name(kind, levels-1), q, true, false, amqp091.Publishing{Headers: hdr, DeliveryMode: 2, Body: benchPayload})
			if err != nil {
				t.Fatal(err)
			}
			dcs = append(dcs, dc)
		}
		for _, dc := range dcs {
			if !dc.Wait() {
				t.Fatal("nack")
			}
		}
		t.Logf("%s: %.0f/s", kind, float64(n)/time.Since(start).Seconds())
	}
	qq, _ := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	t.Logf("queue has %d", qq.Messages)
}
