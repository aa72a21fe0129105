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

	"github.com/sluice-go/sluice/broker"
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

// followOthers runs Journal.FollowOthers in the background (as the idempotency step does)
// and collects what it delivers.
func followOthers(t *testing.T, j broker.Journal, since time.Time) *follower {
	t.Helper()
	oj, ok := j.(interface {
		FollowOthers(context.Context, time.Time, func([]byte), func(), func()) error
	})
	require.True(t, ok, "a stream journal's follower can leave out its own records")
	ctx, cancel := context.WithCancel(context.Background())
	f := &follower{caught: make(chan struct{}), stopped: make(chan error, 1), cancel: cancel}
	var once sync.Once
	go func() {
		f.stopped <- oj.FollowOthers(ctx, since, func(b []byte) {
			f.mu.Lock()
			f.got = append(f.got, string(b))
			f.mu.Unlock()
		}, func() { once.Do(func() { close(f.caught) }) }, func() {})
	}()
	t.Cleanup(func() {
		cancel()
		<-f.stopped
	})
	return f
}

func journalStats(t *testing.T, j broker.Journal) amqp.JournalStats {
	t.Helper()
	st, ok := amqp.JournalStatsOf(j)
	require.True(t, ok)
	return st
}

// Two instances on one journal: each one's FollowOthers delivers what the other appended,
// before and after it caught up, and never its own records, which the idempotency step
// holds already. On RabbitMQ 3.13 and later (4.3 here) a follower that caught up on a
// journal no one else had written to reads markers only, so the broker does not even send
// it its own records, and a record of a new writer still reaches it: the new writer's
// first append is a marker, after which the follower reads everything again. On 3.10,
// which has no stream filters, the follower is sent its own records and skips them itself.
func TestJournal_FollowOthersLeavesOutOwnRecords(t *testing.T) {
	b := newBroker(t, amqp.Config{})
	name := testenv.Name("journal")
	t.Cleanup(func() { testenv.NewRabbit(t).DeleteQueues(name) })
	ctx := context.Background()
	since := time.Now().Add(-time.Hour)

	a := b.Journal(name, time.Hour)
	fa := followOthers(t, a, since)
	fa.waitCaught(t)
	if testenv.Is43() {
		require.Eventually(t, func() bool { return journalStats(t, a).MarkersOnly }, 5*time.Second, time.Millisecond,
			"alone on a new journal, the follower reads markers only")
	} else {
		assert.False(t, journalStats(t, a).MarkersOnly, "RabbitMQ 3.10 has no stream filters")
	}
	const own = 20
	want := make([]string, own)
	for i := range own {
		want[i] = fmt.Sprintf("a-%d", i)
		require.NoError(t, a.Append(ctx, []byte(want[i])))
	}
	assert.Zero(t, journalStats(t, a).HelloMarkers, "no record of a needs a marker before it: its follower's marker was confirmed just before")

	// A second instance: its restore reads every record of a. Its own marker, appended
	// after them, reaches a's follower, which reads everything from there on.
	c := b.Journal(name, time.Hour)
	fc := followOthers(t, c, since)
	fc.waitCaught(t)
	assert.Equal(t, want, fc.records(), "the second instance restores every record of the first")
	require.Eventually(t, func() bool { return !journalStats(t, a).MarkersOnly }, 5*time.Second, time.Millisecond,
		"a's follower reads everything once it read c's marker")
	st := journalStats(t, a)
	if testenv.Is43() {
		assert.Equal(t, int64(1), st.MarkersOnlySwitches)
		assert.LessOrEqual(t, st.OwnRecordsRead, int64(own/4), "RabbitMQ sends at most a few of a's %d records back (a Bloom filter's false positives)", own)
	} else {
		assert.Zero(t, st.MarkersOnlySwitches)
		assert.Equal(t, int64(own), st.OwnRecordsRead, "RabbitMQ 3.10 sends every record back; the follower skips its own")
	}
	for i := range 3 {
		start := time.Now()
		require.NoError(t, c.Append(ctx, []byte(fmt.Sprintf("c-%d", i))))
		require.Eventually(t, func() bool { return len(fa.records()) == i+1 }, 5*time.Second, time.Millisecond,
			"a's follower reads c's record %d", i)
		t.Logf("c's record %d reached a's follower %s after its append began", i, time.Since(start).Round(time.Millisecond))
	}
	require.NoError(t, a.Append(ctx, []byte("a-last")))
	require.Eventually(t, func() bool { return len(fc.records()) == own+1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, "a-last", fc.records()[own])
	assert.Equal(t, []string{"c-0", "c-1", "c-2"}, fa.records(), "a's follower delivers c's records, not a's own")
}

// A writer whose last append was not confirmed within journalHelloGap (here: none yet,
// and no follower's marker) appends a marker before its record, which a follower reading
// markers only reads; the records right after it need none.
func TestJournal_FirstAppendIsMarked(t *testing.T) {
	b := newBroker(t, amqp.Config{})
	name := testenv.Name("journal")
	t.Cleanup(func() { testenv.NewRabbit(t).DeleteQueues(name) })
	j := b.Journal(name, time.Hour)
	require.NoError(t, j.Append(context.Background(), []byte("one")))
	assert.Equal(t, int64(1), journalStats(t, j).HelloMarkers)
	require.NoError(t, j.Append(context.Background(), []byte("two")))
	assert.Equal(t, int64(1), journalStats(t, j).HelloMarkers, "the second record follows a confirm within journalHelloGap")

	// The stream holds the marker, then both records, each naming its writer.
	r := testenv.NewRabbit(t)
	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Qos(10, 0, false))
	deliveries, err := ch.Consume(name, "", false, false, false, false, amqp091.Table{"x-stream-offset": "first"})
	require.NoError(t, err)
	var kinds []string
	writers := map[any]bool{}
	for len(kinds) < 3 {
		select {
		case d := <-deliveries:
			writers[d.Headers["x-sluice-journal-writer"]] = true
			if _, ok := d.Headers["x-sluice-journal-marker"]; ok {
				kinds = append(kinds, "marker")
			} else {
				kinds = append(kinds, string(d.Body))
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("read %v of the stream", kinds)
		}
	}
	assert.Equal(t, []string{"marker", "one", "two"}, kinds)
	assert.Len(t, writers, 1, "one writer id on every append")
	assert.NotContains(t, writers, nil)
}

// A follower reading everything because another writer was active reads markers only
// (RabbitMQ 3.13 and later) once no other writer's append has reached it for
// Q = 2·PublishTimeout + 20 s while its own appends still come back to it, and not
// before; a writer that appends after that is read again from its first append. On 3.10
// it keeps reading everything.
func TestJournal_FollowOthersReadsMarkersOnlyOnceOthersAreQuiet(t *testing.T) {
	const publishTimeout = 2 * time.Second
	quiet := 2*publishTimeout + 20*time.Second
	b := newBroker(t, amqp.Config{PublishTimeout: publishTimeout})
	name := testenv.Name("journal")
	t.Cleanup(func() { testenv.NewRabbit(t).DeleteQueues(name) })
	ctx := context.Background()
	since := time.Now().Add(-time.Hour)

	c := b.Journal(name, time.Hour)
	require.NoError(t, c.Append(ctx, []byte("c-0")))
	a := b.Journal(name, time.Hour)
	fa := followOthers(t, a, since)
	fa.waitCaught(t)
	require.Equal(t, []string{"c-0"}, fa.records())
	require.NoError(t, c.Append(ctx, []byte("c-1")))
	require.Eventually(t, func() bool { return len(fa.records()) == 2 }, 5*time.Second, time.Millisecond)
	lastOther := time.Now()

	// a keeps appending, as a busy instance does; c is gone.
	stop := make(chan struct{})
	appended := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				appended <- nil
				return
			case <-time.After(100 * time.Millisecond):
			}
			if err := a.Append(ctx, []byte(fmt.Sprintf("a-%d", i))); err != nil {
				appended <- err
				return
			}
		}
	}()
	var switched time.Duration
	for deadline := time.Now().Add(quiet + 10*time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if journalStats(t, a).MarkersOnly {
			switched = time.Since(lastOther)
			break
		}
	}
	close(stop)
	require.NoError(t, <-appended)
	if !testenv.Is43() {
		assert.Zero(t, switched, "RabbitMQ 3.10 has no stream filters: the follower reads everything")
		return
	}
	require.NotZero(t, switched, "no other writer's append for %s: the follower reads markers only", quiet)
	assert.GreaterOrEqual(t, switched, quiet, "not before Q")
	t.Logf("read markers only %s after the other writer's last append (Q %s)", switched.Round(time.Millisecond), quiet)

	// A writer quiet for longer than journalHelloGap marks its next append: c's record
	// reaches a again.
	require.NoError(t, c.Append(ctx, []byte("c-2")))
	require.Eventually(t, func() bool { return len(fa.records()) == 3 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, []string{"c-0", "c-1", "c-2"}, fa.records())
	assert.False(t, journalStats(t, a).MarkersOnly)
	assert.Equal(t, int64(2), journalStats(t, c).HelloMarkers, "c marked its first append and the one after its quiet")
}
