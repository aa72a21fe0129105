package idempotency_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/middleware/idempotency"
)

// resyncJournal is memJournal whose follower the test makes lose its place (lost: it
// reports behind and delivers nothing) and find it again (back: it delivers what was
// appended meanwhile, then reports caughtUp), as RabbitMQ's stream journal does across a
// broker restart.
type resyncJournal struct {
	*memJournal
	lost     chan struct{}
	back     chan struct{}
	isBehind chan struct{} // closed once behind was called
}

var _ broker.ResyncingJournal = (*resyncJournal)(nil)

func newResyncJournal(mem *memJournal) *resyncJournal {
	return &resyncJournal{memJournal: mem, lost: make(chan struct{}), back: make(chan struct{}), isBehind: make(chan struct{})}
}

func (j *resyncJournal) Journal(string, time.Duration) broker.Journal { return j }

func (j *resyncJournal) FollowResyncing(ctx context.Context, _ time.Time, deliver func([]byte), caughtUp, behind func()) error {
	next := 0
	drain := func() {
		j.mu.Lock()
		recs := j.records[next:]
		j.mu.Unlock()
		for _, r := range recs {
			deliver(r)
			next++
		}
	}
	drain()
	caughtUp()
	lost := j.lost
	for {
		j.mu.Lock()
		changed := j.changed
		j.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-lost:
			lost = nil
			behind()
			close(j.isBehind)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-j.back:
			}
			drain()
			caughtUp()
		case <-changed:
			if lost != nil || j.backed() {
				drain()
			}
		}
	}
}

// backed reports whether the follower found its place again.
func (j *resyncJournal) backed() bool {
	select {
	case <-j.back:
		return true
	default:
		return false
	}
}

// After its journal follower lost its place (a broker restart), an instance holds a
// message until the follower has caught up again: a key another instance journaled
// meanwhile is then known, and its redelivery here is absorbed, not run a second time.
func TestJournaled_AfterALostFollowerAKeyDoneElsewhereIsAbsorbed(t *testing.T) {
	mem := newMemJournal()
	rj := newResyncJournal(mem)
	var calls atomic.Int64
	charge := func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, nil }

	var absorbed atomic.Int64
	a := journaledStep(t, newGuard(t, idempotency.Config{}), mem, charge)
	b := journaledStep(t, newGuard(t, idempotency.Config{OnDuplicate: func(*message.Message, string) { absorbed.Add(1) }}), rj, charge)

	close(rj.lost)
	<-rj.isBehind
	_, err := a(newMessage("m-1", "pay-1")) // done and journaled on A while B's follower is away
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := b(newMessage("m-1", "pay-1")) // its redelivery, on B
		done <- err
	}()
	select {
	case <-done:
		t.Fatal("B looked the key up before its follower caught up")
	case <-time.After(300 * time.Millisecond):
	}
	close(rj.back)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("B still waits after its follower caught up")
	}
	assert.EqualValues(t, 1, calls.Load(), "charged once, on A")
	assert.EqualValues(t, 1, absorbed.Load(), "B absorbed the redelivery")

	// Caught up: nothing waits any more.
	_, err = b(newMessage("m-2", "pay-2"))
	require.NoError(t, err)
	assert.EqualValues(t, 2, calls.Load())
}

// A follower that never catches up (its marker refused, say) holds messages only for a
// bounded time: then the key is looked up with what the instance knows, and the message
// is handled.
func TestJournaled_AFollowerThatNeverCatchesUpHoldsMessagesBriefly(t *testing.T) {
	rj := newResyncJournal(newMemJournal())
	var calls atomic.Int64
	b := journaledStep(t, newGuard(t, idempotency.Config{}), rj, func(*message.Message) ([]*message.Message, error) {
		calls.Add(1)
		return nil, nil
	})
	close(rj.lost)
	<-rj.isBehind

	done := make(chan error, 1)
	go func() {
		_, err := b(newMessage("m-1", "pay-1"))
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("a message waited for a follower that never caught up without a bound")
	}
	assert.EqualValues(t, 1, calls.Load(), "handled once the bound passed")

	// The bound is spent once per loss: the next message does not wait again.
	_, err := b(newMessage("m-2", "pay-2"))
	require.NoError(t, err)
	assert.EqualValues(t, 2, calls.Load())
	close(rj.back)
}
