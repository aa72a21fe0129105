package amqp_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// follower runs Journal.Follow in the background and collects what it delivers.
type follower struct {
	mu      sync.Mutex
	got     []string
	caught  chan struct{}
	stopped chan error
	cancel  func()
}

func follow(t *testing.T, j interface {
	Follow(context.Context, time.Time, func([]byte), func()) error
}, since time.Time) *follower {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &follower{caught: make(chan struct{}), stopped: make(chan error, 1), cancel: cancel}
	go func() {
		f.stopped <- j.Follow(ctx, since, func(b []byte) {
			f.mu.Lock()
			f.got = append(f.got, string(b))
			f.mu.Unlock()
		}, func() { close(f.caught) })
	}()
	t.Cleanup(func() {
		cancel()
		<-f.stopped
	})
	return f
}

func (f *follower) records() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

func (f *follower) waitCaught(t *testing.T) {
	t.Helper()
	select {
	case <-f.caught:
	case <-time.After(30 * time.Second):
		t.Fatal("Follow never caught up")
	}
}

// A journal is a stream: what was appended before Follow is read back, in order, before
// caughtUp; what is appended after reaches the follower too; the stream carries the
// retention asked for.
func TestJournal_RestoresThenTails(t *testing.T) {
	b := newBroker(t, amqp.Config{URLs: []string{testenv.AMQPURL(t)}})
	name := testenv.Name("journal")
	t.Cleanup(func() { testenv.NewRabbit(t).DeleteQueues(name) })
	j := b.Journal(name, 90*time.Minute)
	ctx := context.Background()
	for i := range 3 {
		require.NoError(t, j.Append(ctx, []byte(fmt.Sprintf("before-%d", i))))
	}

	f := follow(t, j, time.Now().Add(-time.Hour))
	f.waitCaught(t)
	assert.Equal(t, []string{"before-0", "before-1", "before-2"}, f.records(), "the records stored before Follow, in order, by caughtUp")

	require.NoError(t, j.Append(ctx, []byte("after")))
	require.Eventually(t, func() bool { return len(f.records()) == 4 }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, "after", f.records()[3])

	// A second follower (another instance) reads everything, its own marker not included.
	g := follow(t, b.Journal(name, 90*time.Minute), time.Now().Add(-time.Hour))
	g.waitCaught(t)
	assert.Equal(t, []string{"before-0", "before-1", "before-2", "after"}, g.records())

	// The stream is declared with the retention asked for (x-max-age rounds up to seconds):
	// redeclaring it with other arguments is refused.
	ch, err := testenv.NewRabbit(t).Conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(name, true, false, false, false, amqp091.Table{"x-queue-type": "stream", "x-max-age": "5400s",
		"x-max-length-bytes": int64(amqp.JournalMaxBytes), "x-stream-max-segment-size-bytes": int64(8 << 20)})
	assert.NoError(t, err, "the stream has x-max-age 5400s and x-max-length-bytes %d", amqp.JournalMaxBytes)
}

// A stream deleted under a running journal is declared again, loudly and counted: the next
// append succeeds, and the follower, which had lost its consumer, reads the new stream from
// its start.
func TestJournal_DeletedStreamIsDeclaredAgain(t *testing.T) {
	var logs testenv.SyncBuffer
	b := newBroker(t, amqp.Config{URLs: []string{testenv.AMQPURL(t)}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	name := testenv.Name("journal")
	r := testenv.NewRabbit(t)
	t.Cleanup(func() { r.DeleteQueues(name) })
	j := b.Journal(name, time.Hour)
	ctx := context.Background()
	require.NoError(t, j.Append(ctx, []byte("one")))
	f := follow(t, j, time.Time{})
	f.waitCaught(t)

	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDelete(name, false, false, false)
	require.NoError(t, err, "delete the stream under the running journal")
	require.NoError(t, j.Append(ctx, []byte("two")), "an append after the deletion declares the stream again")
	require.Eventually(t, func() bool {
		got := f.records()
		return len(got) > 0 && got[len(got)-1] == "two"
	}, 15*time.Second, 20*time.Millisecond, "the follower reads the new stream; logs:\n%s", logs.String())
	assert.Equal(t, []string{"one", "two"}, f.records())
	st, ok := amqp.JournalStatsOf(j)
	require.True(t, ok)
	assert.GreaterOrEqual(t, st.Recreated, int64(1))
	assert.GreaterOrEqual(t, st.Resumed, int64(1))
	assert.Contains(t, logs.String(), "deleted under a running service")
}
