package poison_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/middleware/poison"
)

var errAlone = errors.New("boom")

type gochannelDLQ struct{ ps *gochannel.GoChannel }

func (d gochannelDLQ) DeadLetter(_ context.Context, queue string, msg *message.Message) error {
	return d.ps.Publish(queue+".dlq", msg)
}

// The poison step alone in a plain Watermill router: every failure is dead-lettered at once
// (no retry step: no delay to retry through) and acked, a Discard is acked, success passes.
func TestMiddleware_AloneInAPlainWatermillRouter(t *testing.T) {
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	mw, err := poison.Middleware(poison.Config{DeadLetterer: gochannelDLQ{ps: ps}})
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(mw)
	var calls atomic.Int64
	r.AddConsumerHandler("h", "orders", ps, func(msg *message.Message) error {
		calls.Add(1)
		switch string(msg.Payload) {
		case "retryable":
			return errAlone
		case "deferred":
			return sluice.Defer(time.Second, errAlone)
		case "discarded":
			return sluice.Discard(errAlone)
		}
		return nil
	})
	dlq, err := ps.Subscribe(context.Background(), "orders.dlq")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
	})
	<-r.Running()
	for _, payload := range []string{"ok", "retryable", "deferred", "discarded"} {
		require.NoError(t, ps.Publish("orders", message.NewMessage(payload, []byte(payload))))
	}
	got := map[string]string{}
	for len(got) < 2 {
		select {
		case m := <-dlq:
			m.Ack()
			got[string(m.Payload)] = m.Metadata.Get(sluice.HeaderErrorMessage)
		case <-time.After(10 * time.Second):
			t.Fatalf("dead letters: %v", got)
		}
	}
	assert.Equal(t, map[string]string{"retryable": "boom", "deferred": "deferred for 1s: boom"}, got)
	assert.Eventually(t, func() bool { return calls.Load() == 4 }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, int64(4), calls.Load(), "nothing redelivered")
	select {
	case m := <-dlq:
		t.Fatalf("unexpected dead letter %s", m.Payload)
	default:
	}
}
