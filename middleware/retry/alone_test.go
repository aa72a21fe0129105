package retry_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/middleware/retry"
)

// gochannelBroker is a broker over a gochannel pub/sub: a delayed copy is published to its
// queue after the delay, a dead letter to queue+".dlq".
type gochannelBroker struct{ ps *gochannel.GoChannel }

func (b gochannelBroker) Delay(_ context.Context, queue string, d time.Duration, msg *message.Message) error {
	time.Sleep(d) // the tests' delays are milliseconds
	return b.ps.Publish(queue, msg)
}

func (b gochannelBroker) DeadLetter(_ context.Context, queue string, msg *message.Message) error {
	return b.ps.Publish(queue+".dlq", msg)
}

// plainRouter runs h behind mw in a plain Watermill router consuming queue from ps.
func plainRouter(t *testing.T, ps *gochannel.GoChannel, queue string, mw message.HandlerMiddleware, h message.NoPublishHandlerFunc) {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(mw)
	r.AddConsumerHandler("h", queue, ps, h)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
	})
	<-r.Running()
}

// The retry step refuses to be built without a way to dead-letter: used alone, a message it
// gave up on would have nowhere to go.
func TestNew_RefusedWithoutADeadLetterer(t *testing.T) {
	_, err := retry.New(retry.Config{Delayer: &fakeDelayer{}})
	require.ErrorIs(t, err, retry.ErrNoDeadLetter)
	assert.Contains(t, err.Error(), "Config.DeadLetterer", "the error names the setting it needs")
}

// The retry step (with its poison step) in a plain Watermill router: a failing message is
// retried through the delay and acked, then succeeds; a permanent failure and a message
// out of retries are dead-lettered and acked, never redelivered by the router.
func TestMiddleware_AloneInAPlainWatermillRouter(t *testing.T) {
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	b := gochannelBroker{ps: ps}
	cfg := testPolicy()
	cfg.MaxRetries = 2
	cfg.InitialDelay, cfg.MaxDelay = time.Millisecond, 5*time.Millisecond
	cfg.Delayer, cfg.DeadLetterer = b, b
	r, err := retry.New(cfg)
	require.NoError(t, err)

	dlq, err := ps.Subscribe(context.Background(), "orders.dlq")
	require.NoError(t, err)
	var calls atomic.Int64
	plainRouter(t, ps, "orders", r.Middleware, func(msg *message.Message) error {
		calls.Add(1)
		switch string(msg.Payload) {
		case "flaky":
			if sluice.RetryCount(msg.Metadata) < 1 {
				return errBoom
			}
			return nil
		case "declined":
			return sluice.Permanent(errBoom)
		}
		return errBoom // "broken": every attempt fails
	})
	for _, payload := range []string{"flaky", "declined", "broken"} {
		require.NoError(t, ps.Publish("orders", message.NewMessage(payload, []byte(payload))))
	}

	got := map[string]message.Metadata{}
	for len(got) < 2 {
		select {
		case m := <-dlq:
			m.Ack()
			got[string(m.Payload)] = m.Metadata
		case <-time.After(10 * time.Second):
			t.Fatalf("dead letters: %v", got)
		}
	}
	assert.Equal(t, "error", got["declined"].Get(sluice.HeaderErrorType))
	assert.Equal(t, "0", got["declined"].Get(sluice.HeaderRetryCount), "a permanent failure is not retried")
	assert.Equal(t, "2", got["broken"].Get(sluice.HeaderRetryCount), "dead-lettered after its retries")
	// flaky: 2 attempts; declined: 1; broken: 3 (first + 2 retries). A nack would have
	// made the router redeliver, and the count grow.
	assert.Eventually(t, func() bool { return calls.Load() == 6 }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, int64(6), calls.Load(), "nothing redelivered")
}
