package brokertest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
)

// Delay delivers a copy of the message to the queue after the delay, never before, with
// its id, payload and metadata; it returns once the copy is confirmed. Delays run side by
// side: a short delay given after a long one is delivered first.
func (s *suite) delayer(t *testing.T) {
	b := s.broker(t)
	q := queue(t, b)
	long, short, none := newMessage("long"), newMessage("short"), newMessage("none")
	delays := map[string]time.Duration{long.UUID: 700 * time.Millisecond, short.UUID: 300 * time.Millisecond, none.UUID: 0}
	sent := map[string]*message.Message{long.UUID: long, short.UUID: short, none.UUID: none}
	start := time.Now()
	require.NoError(t, b.Delay(ctx(t), q, delays[long.UUID], long))
	require.NoError(t, b.Delay(ctx(t), q, delays[short.UUID], short))
	require.NoError(t, b.Delay(ctx(t), q, 0, none))
	sub := subscribe(t, b, q, broker.SubscribeOptions{})
	for _, want := range []string{none.UUID, short.UUID, long.UUID} {
		got := sub.next(t)
		require.Equal(t, want, got.UUID, "delivered in the order of their due times")
		assert.GreaterOrEqual(t, time.Since(start), delays[want], "%s not before its delay", got.Payload)
		sameMessage(t, sent[want], got)
		got.Ack()
	}
}

// NativeRetrier (Features.NativeRetry): a queue declared with DeclareNativeRetryQueue
// holds a delivery rejected for it (broker.SettleHoldBack) back for the schedule's delay
// before delivering it again, and gives one returned unprocessed (broker.SettleReturn)
// back at once. A NativeRetrier that cannot carry it out (Features.NativeRetry false)
// refuses with an error; an invalid schedule is an error wrapping broker.ErrNativeRetry.
func (s *suite) nativeRetrier(t *testing.T) {
	b := s.broker(t)
	nr, ok := b.(broker.NativeRetrier)
	if !s.has.NativeRetry && !ok {
		return // the capability is optional, and the broker does not claim it
	}
	require.True(t, ok, "Features.NativeRetry, but the broker is no broker.NativeRetrier")
	assert.ErrorIs(t, nr.DeclareNativeRetryQueue(ctx(t), name(t, "invalid"), broker.NativeRetry{}), broker.ErrNativeRetry)
	const hold = 500 * time.Millisecond
	q := name(t, "native")
	err := nr.DeclareNativeRetryQueue(ctx(t), q, broker.NativeRetry{Min: hold, Max: hold, MaxRetries: 1})
	if !s.has.NativeRetry {
		assert.Error(t, err, "a NativeRetrier without native retry here refuses to declare it")
		return
	}
	require.NoError(t, err)
	m := newMessage("held back")
	publish(t, b, q, m)
	sub := subscribe(t, b, q, broker.SubscribeOptions{})
	got := sub.next(t)
	broker.DeliveryFrom(got.Context()).Settle(broker.SettleHoldBack)
	start := time.Now()
	require.True(t, got.Nack())
	got = sub.next(t)
	sameMessage(t, m, got)
	assert.GreaterOrEqual(t, time.Since(start), hold-50*time.Millisecond, "held back by the queue")

	broker.DeliveryFrom(got.Context()).Settle(broker.SettleReturn)
	start = time.Now()
	require.True(t, got.Nack())
	got = sub.next(t)
	assert.Less(t, time.Since(start), hold-100*time.Millisecond, "a return is not held back")
	got.Ack()
}

// ConsumerCounter (Features.ConsumerCounter) counts a queue's consumers: none, one while
// a subscriber consumes it, none once it closed.
func (s *suite) consumerCounter(t *testing.T) {
	b := s.broker(t)
	cc, ok := b.(broker.ConsumerCounter)
	require.Equal(t, s.has.ConsumerCounter, ok, "Features.ConsumerCounter says whether the broker is a broker.ConsumerCounter")
	if !ok {
		return
	}
	q := queue(t, b)
	count := func() int {
		n, err := cc.ConsumerCount(context.Background(), q)
		if err != nil {
			return -1
		}
		return n
	}
	assert.Zero(t, count())
	sub := subscribe(t, b, q, broker.SubscribeOptions{})
	assert.Eventually(t, func() bool { return count() == 1 }, eventually, tick, "one consumer")
	sub.close(t)
	assert.Eventually(t, func() bool { return count() == 0 }, eventually, tick, "none once it closed")
}

// Joiner (Features.Joiner) keeps a membership of a queue's instances: each member lists
// every member heard recently (itself included) within a few intervals, a broadcast
// reaches the other members with its sender's id, and a member that leaves (Close) is
// dropped from the others' lists, which say so (Changed).
func (s *suite) joiner(t *testing.T) {
	b := s.broker(t)
	j, ok := b.(broker.Joiner)
	require.Equal(t, s.has.Joiner, ok, "Features.Joiner says whether the broker is a broker.Joiner")
	if !ok {
		return
	}
	q := name(t, "members")
	type heard struct{ from, body string }
	var mu sync.Mutex
	var got []heard
	const interval = 50 * time.Millisecond
	a, err := j.Join(ctx(t), q, broker.MembershipConfig{ID: "a", Interval: interval})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	bm, err := j.Join(ctx(t), q, broker.MembershipConfig{ID: "b", Interval: interval, OnBroadcast: func(from string, body []byte) {
		mu.Lock()
		got = append(got, heard{from, string(body)})
		mu.Unlock()
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = bm.Close() })
	assert.Equal(t, "a", a.ID())
	both := func() bool {
		ma, mb := a.Members(), bm.Members()
		slices.Sort(ma)
		slices.Sort(mb)
		return slices.Equal(ma, []string{"a", "b"}) && slices.Equal(mb, []string{"a", "b"})
	}
	require.Eventually(t, both, eventually, tick, "each lists both")

	require.NoError(t, a.Broadcast(ctx(t), []byte("hello")))
	assert.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(got, heard{"a", "hello"})
	}, eventually, tick, "b hears a's broadcast")

	changed := a.Changed()
	require.NoError(t, bm.Close())
	select {
	case <-changed:
	case <-time.After(eventually):
		assert.Fail(t, "a did not hear b leave")
	}
	assert.Eventually(t, func() bool { return slices.Equal(a.Members(), []string{"a"}) }, eventually, tick, "b is no longer listed")
}

// Journaler (Features.Journaler) keeps append-only journals: Follow delivers every record
// appended, in order, then says it caught up, then delivers new records as they are
// appended, until its context ends, when it returns the context's error. A
// broker.ResyncingJournal's FollowResyncing does the same, and, with nothing lost, never
// says it fell behind.
func (s *suite) journaler(t *testing.T) {
	b := s.broker(t)
	jr, ok := b.(broker.Journaler)
	require.Equal(t, s.has.Journaler, ok, "Features.Journaler says whether the broker is a broker.Journaler")
	if !ok {
		return
	}
	j := jr.Journal(name(t, "journal"), time.Hour)
	require.NoError(t, j.Append(ctx(t), []byte("r1")))
	require.NoError(t, j.Append(ctx(t), []byte("r2")))

	type follower struct {
		mu       sync.Mutex
		records  []string
		caughtUp chan struct{}
		behind   int
		done     chan error
	}
	follow := func(resync bool) *follower {
		f := &follower{caughtUp: make(chan struct{}), done: make(chan error, 1)}
		c, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		var once sync.Once
		deliver := func(body []byte) {
			f.mu.Lock()
			f.records = append(f.records, string(body))
			f.mu.Unlock()
		}
		caught := func() { once.Do(func() { close(f.caughtUp) }) }
		go func() {
			if rj, ok := j.(broker.ResyncingJournal); ok && resync {
				f.done <- rj.FollowResyncing(c, time.Time{}, deliver, caught, func() {
					f.mu.Lock()
					f.behind++
					f.mu.Unlock()
				})
				return
			}
			f.done <- j.Follow(c, time.Time{}, deliver, caught)
		}()
		t.Cleanup(func() {
			cancel()
			select {
			case err := <-f.done:
				assert.ErrorIs(t, err, context.Canceled, "Follow returns its context's error")
			case <-time.After(eventually):
				assert.Fail(t, "Follow did not return once its context ended")
			}
		})
		return f
	}
	read := func(f *follower) []string {
		f.mu.Lock()
		defer f.mu.Unlock()
		return slices.Clone(f.records)
	}
	followers := []*follower{follow(false)}
	if _, ok := j.(broker.ResyncingJournal); ok {
		followers = append(followers, follow(true))
	}
	for _, f := range followers {
		select {
		case <-f.caughtUp:
		case <-time.After(eventually):
			require.FailNow(t, "Follow never caught up")
		}
		assert.Equal(t, []string{"r1", "r2"}, read(f), "every record appended before, in order, before catching up")
	}
	require.NoError(t, j.Append(ctx(t), []byte("r3")))
	for _, f := range followers {
		assert.Eventually(t, func() bool { return slices.Equal(read(f), []string{"r1", "r2", "r3"}) }, eventually, tick, "a new record follows")
		f.mu.Lock()
		assert.Zero(t, f.behind, "nothing lost: never behind")
		f.mu.Unlock()
	}
}
