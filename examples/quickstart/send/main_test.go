package main

import (
	"context"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// The docs' way to send the quickstart a payment: a persistent JSON message, confirmed, on
// the exchange and key the quickstart binds; and a clear error when nothing is bound yet.
func TestSend(t *testing.T) {
	r := testenv.NewRabbit(t)
	exchange, queue := testenv.Name("send.orders"), testenv.Name("send.requested")
	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
		_ = ch.Close()
	})
	require.NoError(t, ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil))
	_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(queue, "payment.requested", exchange, false, nil))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body := `{"payment_id":"pay_1","amount_cents":1299}`
	require.NoError(t, send(ctx, r.URL, exchange, "payment.requested", "m-1", []byte(body)))
	d, ok := r.Get(queue)
	require.True(t, ok, "the payment reached the bound queue")
	assert.Equal(t, body, string(d.Body))
	assert.Equal(t, "m-1", d.MessageId)
	assert.Equal(t, "application/json", d.ContentType)
	assert.Equal(t, amqp091.Persistent, d.DeliveryMode)

	err = send(ctx, r.URL, exchange, "payment.refunded", "m-2", []byte(body))
	require.ErrorIs(t, err, errUnrouted, "no queue bound for the key")
}
