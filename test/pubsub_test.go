package test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/binding"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// newExchange names a fresh exchange and deletes it after the test on RabbitMQ.
func (e *env) newExchange(t *testing.T, prefix string) string {
	x := testenv.Name(prefix)
	if e.rabbit != nil {
		deleteExchangesAfter(t, e.rabbit.URL, x)
	}
	return x
}

// deleteExchangesAfter deletes exchanges when t ends.
func deleteExchangesAfter(t *testing.T, url string, exchanges ...string) {
	t.Cleanup(func() {
		conn, err := amqp091.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		for _, x := range exchanges {
			if ch, err := conn.Channel(); err == nil {
				_ = ch.ExchangeDelete(x, false, false)
				_ = ch.Close()
			}
		}
	})
}

// publishToExchange sends msg to exchange with key as a producer outside sluice would: a
// plain amqp091 publish with confirm on RabbitMQ.
func (e *env) publishToExchange(t *testing.T, exchange, key string, msg *message.Message) {
	t.Helper()
	if e.rabbit == nil {
		require.NoError(t, e.mem.PublishToExchange(context.Background(), exchange, key, msg))
		return
	}
	pub, err := amqp.Marshaler{}.Marshal(msg)
	require.NoError(t, err)
	ch, err := e.rabbit.Conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	require.NoError(t, ch.Confirm(false))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, pub)
	require.NoError(t, err)
	ok, err := dc.WaitContext(ctx)
	require.NoError(t, err)
	require.True(t, ok, "publish to exchange %s confirmed", exchange)
}

// deliveries counts handler calls per message id, per handler.
type deliveries struct {
	mu sync.Mutex
	n  map[string]map[string]int
}

func (d *deliveries) add(handler, id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[string]map[string]int{}
	}
	if d.n[handler] == nil {
		d.n[handler] = map[string]int{}
	}
	d.n[handler][id]++
	return d.n[handler][id]
}

func (d *deliveries) of(handler string) map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]int{}
	for k, v := range d.n[handler] {
		out[k] = v
	}
	return out
}

// Two subscribers bound to one topic exchange with different keys each get every event
// their keys match once (a subscriber two of whose keys match gets it once too). A handler
// failing twice on one subscriber retries only there, and a deferral stays there too; on
// RabbitMQ a dead letter replayed from one subscriber's DLQ goes back to that subscriber
// only.
func TestSubscribersEachGetEveryEventAndRetriesStayWithThem(t *testing.T) {
	onEachBroker(t, func(t *testing.T, e *env) {
		exchange := e.newExchange(t, "test.orders")
		qa, qb := e.newQueue(t, "test.sub.billing"), e.newQueue(t, "test.sub.shipping")
		var got deliveries
		cfg := router.Config{Retry: retry.Config{MaxRetries: 3, InitialDelay: 50 * time.Millisecond, MaxDelay: 100 * time.Millisecond, Jitter: retry.NoJitter}}
		start(t, e, cfg, func(s *router.Stack) {
			require.NoError(t, s.Handle("billing", qa, func(m *message.Message) error {
				n := got.add("billing", m.UUID)
				switch {
				case m.UUID == "created-1" && n <= 2:
					return errors.New("ledger not ready")
				case m.UUID == "paid-1" && n == 1:
					return sluice.Permanent(errors.New("refused"))
				case m.UUID == "paid-2" && n == 1:
					return sluice.Defer(50*time.Millisecond, errors.New("ledger busy"))
				}
				return nil
			}, router.WithSubscription(router.Binding{Exchange: exchange, Keys: []string{"order.*"}})))
			require.NoError(t, s.Handle("shipping", qb, func(m *message.Message) error {
				got.add("shipping", m.UUID)
				return nil
			}, router.WithSubscription(router.Binding{Exchange: exchange, Kind: router.Topic, Keys: []string{"order.created", "*.paid"}})))
		})
		for id, key := range map[string]string{"created-1": "order.created", "paid-1": "order.paid", "paid-2": "order.paid", "shipped-1": "order.shipped", "invoice-1": "invoice.paid"} {
			e.publishToExchange(t, exchange, key, message.NewMessage(id, []byte(`{}`)))
		}
		wantBilling := map[string]int{"created-1": 3, "paid-1": 1, "paid-2": 2, "shipped-1": 1}
		wantShipping := map[string]int{"created-1": 1, "paid-1": 1, "paid-2": 1, "invoice-1": 1}
		settle(t, func() bool {
			return assert.ObjectsAreEqual(wantBilling, got.of("billing")) && assert.ObjectsAreEqual(wantShipping, got.of("shipping"))
		}, "each subscriber gets its events; the retries and the deferral stay with billing")
		assert.Equal(t, wantBilling, got.of("billing"))
		assert.Equal(t, wantShipping, got.of("shipping"))
		require.Equal(t, 1, e.count(t, topology.DLQ(qa)), "billing's refusal is in billing's DLQ")
		require.Equal(t, 0, e.count(t, topology.DLQ(qb)))
		if e.rabbit == nil {
			return // the dlq package (replay) is RabbitMQ's
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		op := dlq.NewOperator(e.rabbit.Conn)
		var replayed []dlq.Moved
		op.OnMoved = func(m dlq.Moved) { replayed = append(replayed, m) }
		_, err := op.Replay(ctx, qa, dlq.Selector{IDs: []string{"paid-1"}}, dlq.Options{})
		require.NoError(t, err)
		require.Len(t, replayed, 1)
		require.Equal(t, qa, replayed[0].Destination)
		wantBilling["paid-1"] = 2
		settle(t, func() bool { return assert.ObjectsAreEqual(wantBilling, got.of("billing")) }, "the replay reaches billing")
		assert.Equal(t, wantBilling, got.of("billing"))
		assert.Equal(t, wantShipping, got.of("shipping"), "shipping never sees billing's replay")
	})
}

// unroutedOf returns the events of sluice.unrouted published to exchange, leaving the
// queue (shared by every test of the vhost) as it was.
func (e *env) unroutedOf(t *testing.T, exchange string) []dlq.UnroutedEvent {
	t.Helper()
	if e.rabbit == nil {
		var out []dlq.UnroutedEvent
		for _, m := range e.mem.Peek(topology.UnroutedQueue) {
			if m.Metadata.Get(binding.MetadataExchange) == exchange {
				out = append(out, dlq.UnroutedEvent{ID: m.UUID, Exchange: exchange, RoutingKey: m.Metadata.Get(binding.MetadataRoutingKey), Payload: string(m.Payload)})
			}
		}
		return out
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := dlq.ListUnrouted(ctx, e.rabbit.Conn, dlq.UnroutedSelector{Exchange: exchange}, 0)
	require.NoError(t, err)
	return l.Events
}

func (e *env) replayUnrouted(t *testing.T, exchange string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if e.rabbit == nil {
		n, err := e.mem.ReplayUnrouted(ctx, exchange)
		require.NoError(t, err)
		return n
	}
	res, err := dlq.ReplayUnrouted(ctx, e.rabbit.Conn, dlq.UnroutedSelector{Exchange: exchange}, false)
	require.NoError(t, err)
	return len(res.Replayed)
}

// A handler's outputs to an exchange nobody is bound for are confirmed and kept in
// sluice.unrouted with their exchange, routing key (the handler's, or the message's own)
// and payload; a replay before anyone subscribes puts them back; once a queue is bound, a
// replay delivers them there.
func TestOutputsNobodyIsBoundForAreKeptAndReplayed(t *testing.T) {
	onEachBroker(t, func(t *testing.T, e *env) {
		in := e.newQueue(t, "test.out.in")
		sub := e.newQueue(t, "test.out.sub")
		exchange := e.newExchange(t, "test.payments")
		if e.rabbit != nil {
			testenv.LockUnrouted(t)
		}
		start(t, e, router.Config{}, func(s *router.Stack) {
			require.NoError(t, s.HandleWithOutput("charge", in, "", func(m *message.Message) ([]*message.Message, error) {
				ok := message.NewMessage("ok-"+m.UUID, []byte("succeeded"))
				flagged := message.NewMessage("flag-"+m.UUID, []byte("flagged"))
				flagged.Metadata.Set(router.RoutingKeyMetadata, "payment.flagged")
				return []*message.Message{ok, flagged}, nil
			}, router.WithOutputExchange(router.Output{Exchange: exchange, RoutingKey: "payment.succeeded"})))
		})
		e.publish(t, in, message.NewMessage("p1", []byte(`{}`)))

		var events []dlq.UnroutedEvent
		require.Eventually(t, func() bool { events = e.unroutedOf(t, exchange); return len(events) == 2 }, 30*time.Second, 50*time.Millisecond)
		keys := map[string]string{}
		for _, ev := range events {
			assert.Equal(t, exchange, ev.Exchange)
			keys[ev.ID] = ev.RoutingKey
		}
		assert.Equal(t, map[string]string{"ok-p1": "payment.succeeded", "flag-p1": "payment.flagged"}, keys)
		assert.Equal(t, 0, e.count(t, in), "the input was acked after the confirmed outputs")

		// Nobody bound yet: a replay puts them back, and does not loop.
		require.Equal(t, 2, e.replayUnrouted(t, exchange))
		require.Eventually(t, func() bool { return len(e.unroutedOf(t, exchange)) == 2 }, 30*time.Second, 50*time.Millisecond)

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if e.rabbit != nil {
			require.NoError(t, e.amqp.DeclareSubscription(ctx, sub, []broker.Binding{{Exchange: exchange, Keys: []string{"payment.*"}}}, false))
		} else {
			require.NoError(t, e.mem.DeclareSubscription(ctx, sub, []binding.Binding{{Exchange: exchange, Keys: []string{"payment.*"}}}, false))
		}
		require.Equal(t, 2, e.replayUnrouted(t, exchange))
		require.Eventually(t, func() bool { return e.count(t, sub) == 2 }, 30*time.Second, 50*time.Millisecond)
		assert.Empty(t, e.unroutedOf(t, exchange))
	})
}

// A queue declared beforehand by a plain amqp091 client with other arguments is refused
// with an error naming the argument and what to do, and adopted when asked: the handler
// then consumes it through the exchange, and its retries come back to it.
func TestPreDeclaredQueueIsAdoptedOrRefused(t *testing.T) {
	e := rabbitEnv(t)
	queue := e.newQueue(t, "test.adopt")
	exchange := e.newExchange(t, "test.adopt.x")
	ch, err := e.rabbit.Conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp091.Table{"x-max-length": int64(10000)})
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	binding := router.Binding{Exchange: exchange, Kind: router.Direct, Keys: []string{"order.created"}}

	s, err := router.New(e.broker, router.Config{Logger: testLogger()})
	require.NoError(t, err)
	require.NoError(t, s.Handle("refused", queue, func(*message.Message) error { return nil }, router.WithSubscription(binding)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = s.Run(ctx)
	t.Logf("refused: %v", err)
	require.ErrorIs(t, err, broker.ErrInequivalent)
	var ie *amqp.InequivalentError
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, queue, ie.Name)
	assert.Contains(t, []string{"x-max-length", "x-queue-type", "x-dead-letter-exchange"}, ie.Argument)
	assert.Contains(t, err.Error(), ie.Argument)
	assert.Contains(t, err.Error(), "router.WithAdopt")
	// s is not closed: Run stopped before consuming, and Watermill's Close of a router
	// that never ran waits out the close timeout.

	var got deliveries
	start(t, e, router.Config{Retry: retry.Config{MaxRetries: 2, InitialDelay: 50 * time.Millisecond, Jitter: retry.NoJitter}}, func(s *router.Stack) {
		require.NoError(t, s.Handle("adopted", queue, func(m *message.Message) error {
			if got.add("adopted", m.UUID) == 1 {
				return errors.New("first attempt fails")
			}
			return nil
		}, router.WithSubscription(binding), router.WithAdopt()))
	})
	e.publishToExchange(t, exchange, "order.created", message.NewMessage("o1", []byte(`{}`)))
	settle(t, func() bool { return got.of("adopted")["o1"] == 2 }, "the adopted queue's message, then its retry")
	assert.Equal(t, map[string]int{"o1": 2}, got.of("adopted"))
}

// A queue the stack only publishes to gets no dead-letter queue; the consumed one does.
func TestOutputQueueGetsNoDeadLetterQueue(t *testing.T) {
	e := rabbitEnv(t)
	in, out := e.newQueue(t, "test.outq.in"), e.newQueue(t, "test.outq.out")
	start(t, e, router.Config{}, func(s *router.Stack) {
		require.NoError(t, s.HandleWithOutput("copy", in, out, func(m *message.Message) ([]*message.Message, error) {
			return []*message.Message{message.NewMessage("copy-"+m.UUID, m.Payload)}, nil
		}))
	})
	e.publish(t, in, message.NewMessage("m1", []byte("x")))
	require.Eventually(t, func() bool { return e.count(t, out) == 1 }, 30*time.Second, 20*time.Millisecond)
	assert.Equal(t, 0, e.count(t, topology.DLQ(in)))
	assert.Equal(t, -1, e.count(t, topology.DLQ(out)), "no DLQ for the output queue")
}
