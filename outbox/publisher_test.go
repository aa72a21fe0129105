package outbox_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/outboxstore"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/outbox"
)

func TestPublisher_BrokerUpPublishesDirectly(t *testing.T) {
	rabbit := testenv.NewRabbit(t)
	queue := testenv.Name("outbox.direct")
	rabbit.DeleteQueues(queue, topology.DLQ(queue))
	b := connect(t, rabbit.URL, queue)
	ob, err := outbox.New(b.Publisher(), outbox.Config{Dir: t.TempDir(), Logger: quietLogger()})
	require.NoError(t, err)
	defer ob.Close()

	produce(t, ob, queue, 2, 0, 50)
	st := ob.Stats()
	require.Equal(t, outbox.Stats{Direct: 100}, st)
	require.Equal(t, 100, rabbit.Count(queue))
}

func TestPublisher_UnroutableIsTheCallersError(t *testing.T) {
	rabbit := testenv.NewRabbit(t)
	queue := testenv.Name("outbox.unroutable")
	rabbit.DeleteQueues(queue, topology.DLQ(queue))
	b := connect(t, rabbit.URL, queue)
	ob, err := outbox.New(b.Publisher(), outbox.Config{Dir: t.TempDir(), Logger: quietLogger()})
	require.NoError(t, err)
	defer ob.Close()

	err = ob.Publish(queue+".nobody", seqMessage(0, 0))
	require.ErrorIs(t, err, amqp.ErrUnroutable)
	require.Equal(t, outbox.Stats{}, ob.Stats(), "nothing kept: publishing it again would be returned again")
}

// Entries an earlier run left go first, a new publish queues behind them, and one that
// the broker refuses for good is set aside without blocking the others.
func TestPublisher_ForwardsLeftEntriesFirstAndSetsAsideUnroutable(t *testing.T) {
	rabbit := testenv.NewRabbit(t)
	queue := testenv.Name("outbox.left")
	rabbit.DeleteQueues(queue, topology.DLQ(queue))
	b := connect(t, rabbit.URL, queue)
	dir := t.TempDir()

	s, err := outboxstore.OpenStore(dir, 100, 1<<20)
	require.NoError(t, err)
	left := []outboxstore.Entry{
		{Topic: queue, UUID: "p0-000000", Payload: []byte("0")},
		{Topic: queue, UUID: "p0-000001", Payload: []byte("1")},
		{Topic: queue + ".nobody", UUID: "lost", Payload: []byte("x")},
		{Topic: queue, UUID: "p0-000002", Payload: []byte("2")},
	}
	require.NoError(t, s.Append(left))
	require.NoError(t, s.Close())

	ob, err := outbox.New(b.Publisher(), outbox.Config{Dir: dir, Logger: quietLogger()})
	require.NoError(t, err)
	defer ob.Close()
	require.NoError(t, ob.Publish(queue, seqMessage(0, 3)))
	require.Eventually(t, func() bool { return ob.Stats().Pending == 0 }, 20*time.Second, 20*time.Millisecond)
	st := ob.Stats()
	require.Equal(t, uint64(1), st.Rejected)
	require.Equal(t, uint64(4), st.Forwarded)
	require.Equal(t, uint64(1), st.Kept, "the new publish went behind the left entries")

	for i := 0; i < 4; i++ {
		d, ok := rabbit.Get(queue)
		require.True(t, ok, "message %d", i)
		require.Equal(t, fmt.Sprintf("p0-%06d", i), d.MessageId)
	}
	rejected, err := ob.Rejected()
	require.NoError(t, err)
	require.Len(t, rejected, 1)
	require.Equal(t, queue+".nobody", rejected[0].Topic)
	require.Equal(t, "lost", rejected[0].Message.UUID)
	require.Equal(t, []byte("x"), []byte(rejected[0].Message.Payload))
	require.Contains(t, rejected[0].Reason, "unroutable")
	require.NoError(t, ob.Close())
	_, err = ob.Rejected()
	require.ErrorIs(t, err, outbox.ErrClosed)
}

// failing is a publisher that never confirms, for the outbox's own limits (a unit test:
// the broker outage itself is TestOutboxOutage's).
type failing struct{}

func (failing) Publish(string, ...*message.Message) error { return errors.New("broker unreachable") }
func (failing) Close() error                              { return nil }

func TestPublisher_FullOutboxRefuses(t *testing.T) {
	ob, err := outbox.New(failing{}, outbox.Config{Dir: t.TempDir(), MaxMessages: 3, RetryMaxInterval: time.Hour, Logger: quietLogger()})
	require.NoError(t, err)
	defer ob.Close()
	for i := 0; i < 3; i++ {
		require.NoError(t, ob.Publish("q", seqMessage(0, i)))
	}
	err = ob.Publish("q", seqMessage(0, 3))
	require.ErrorIs(t, err, outbox.ErrFull)
	require.Equal(t, 3, ob.Stats().Pending)
	require.NoError(t, ob.Close())
	require.ErrorIs(t, ob.Publish("q", seqMessage(0, 4)), outbox.ErrClosed)
}

func TestConfig_Defaults(t *testing.T) {
	tests := []struct {
		name string
		cfg  outbox.Config
		err  string
	}{
		{"no dir", outbox.Config{}, "no directory"},
		{"negative", outbox.Config{Dir: "x", MaxMessages: -1}, "MaxMessages is negative"},
		{"defaults", outbox.Config{Dir: "x"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := outbox.Validate(&tt.cfg)
			if tt.err == "" {
				require.NoError(t, err)
				require.Equal(t, 2*time.Second, tt.cfg.DirectTimeout)
				return
			}
			require.ErrorContains(t, err, tt.err)
		})
	}
}

func TestPublisher_CloseLeavesNoGoroutine(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ob, err := outbox.New(failing{}, outbox.Config{Dir: t.TempDir(), RetryMaxInterval: 10 * time.Millisecond, Logger: quietLogger()})
	require.NoError(t, err)
	require.NoError(t, ob.Publish("q", seqMessage(0, 0)))
	time.Sleep(50 * time.Millisecond) // the forwarder is retrying
	require.NoError(t, ob.Close())
}
