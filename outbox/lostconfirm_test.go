package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/outbox"
	"github.com/sluice-go/sluice/outbox/pgoutbox"
)

// lostConfirms publishes through pub, and then reports every every-th publish as failed:
// the broker has the messages, the caller does not know it (a confirm lost with its
// connection). It makes the copies an outage may make, on every run.
type lostConfirms struct {
	pub   message.Publisher
	every int64
	n     atomic.Int64
	lost  atomic.Int64
}

var errConfirmLost = errors.New("test: confirm lost")

func (l *lostConfirms) PublishContext(ctx context.Context, topic string, messages ...*message.Message) error {
	if err := l.pub.(interface {
		PublishContext(context.Context, string, ...*message.Message) error
	}).PublishContext(ctx, topic, messages...); err != nil {
		return err
	}
	if l.n.Add(1)%l.every == 0 {
		l.lost.Add(1)
		return errConfirmLost
	}
	return nil
}

func (l *lostConfirms) Publish(topic string, messages ...*message.Message) error {
	return l.PublishContext(context.Background(), topic, messages...)
}

func (l *lostConfirms) Close() error { return nil }

// contextPublisher gives *amqp.Publisher the ContextPublisher shape lostConfirms calls.
type contextPublisher struct {
	message.Publisher
	publishTo func(ctx context.Context, exchange, routingKey string, messages ...*message.Message) error
}

func (c contextPublisher) PublishContext(ctx context.Context, topic string, messages ...*message.Message) error {
	return c.publishTo(ctx, "", topic, messages...)
}

// Both outboxes publish again what the broker has but did not confirm; the copies keep the
// message's id, and the consumer's idempotency step runs each message's handler once.
func TestOutbox_CopiesOfLostConfirmsHaveTheirEffectOnce(t *testing.T) {
	const producers, perProducer = 2, 250
	rabbit := testenv.NewRabbit(t)
	tests := []struct {
		name string
		// run publishes the messages through an outbox over pub and waits until it drained.
		run func(t *testing.T, pub message.Publisher, queue string)
	}{
		{"file outbox", func(t *testing.T, pub message.Publisher, queue string) {
			ob, err := outbox.New(pub, outbox.Config{Dir: t.TempDir(), RetryMaxInterval: 100 * time.Millisecond, Logger: quietLogger()})
			require.NoError(t, err)
			defer func() { require.NoError(t, ob.Close()) }()
			produce(t, ob, queue, producers, 0, perProducer)
			require.Eventually(t, func() bool { return ob.Stats().Pending == 0 }, 60*time.Second, 20*time.Millisecond, "outbox drained: %+v", ob.Stats())
		}},
		{"Watermill's SQL forwarder on PostgreSQL", func(t *testing.T, pub message.Publisher, queue string) {
			db, err := sql.Open("postgres", testenv.PostgresURL(t))
			require.NoError(t, err)
			defer db.Close()
			topic := strings.NewReplacer(".", "_").Replace(testenv.Name("sluice_outbox_lost"))
			t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS "watermill_` + topic + `"`) })
			ob, err := pgoutbox.New(db, pub, pgoutbox.Config{
				Topic: topic, ResendInterval: 50 * time.Millisecond, Logger: quietWatermill(),
			})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			runDone := make(chan error, 1)
			go func() { runDone <- ob.Run(ctx) }()
			defer func() {
				cancel()
				require.NoError(t, ob.Close())
				<-runDone
			}()
			<-ob.Running()
			in, err := ob.DBPublisher()
			require.NoError(t, err)
			produce(t, in, queue, producers, 0, perProducer)
			require.Eventually(t, func() bool {
				n, err := ob.Pending(ctx)
				return err == nil && n == 0
			}, 60*time.Second, 20*time.Millisecond, "outbox table drained")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			queue := testenv.Name("outbox.lost")
			rabbit.DeleteQueues(queue, topology.DLQ(queue))
			b := connect(t, rabbit.URL, queue)
			lossy := &lostConfirms{
				pub:   contextPublisher{b.Publisher(), b.Publisher().PublishTo},
				every: 25,
			}
			tt.run(t, lossy, queue)
			require.Positive(t, lossy.lost.Load(), "confirms lost")

			r := consumeOnce(t, b, queue, producers*perProducer)
			requireAllInOrder(t, r, producers, 0, perProducer)
			require.GreaterOrEqual(t, r.duplicates, int(lossy.lost.Load()), "copies acknowledged as duplicates: at least one per lost confirm")
			t.Logf("%d confirms lost; consumer: %d deliveries, %d copies acknowledged as duplicates, %d side effects",
				lossy.lost.Load(), r.total, r.duplicates, producers*perProducer)
		})
	}
}
