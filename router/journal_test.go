package router_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/router"
)

// gatedJournals is the test broker keeping idempotency journals in memory whose restore
// (Follow's caughtUp) waits until open is closed. The stream journal itself is tested on
// RabbitMQ in broker/amqp and test/.
type gatedJournals struct {
	*testBroker
	open chan struct{}
	mu   sync.Mutex
	recs map[string][][]byte
}

func (g *gatedJournals) Journal(name string, _ time.Duration) broker.Journal {
	return gatedJournal{g: g, name: name}
}

type gatedJournal struct {
	g    *gatedJournals
	name string
}

func (j gatedJournal) Append(_ context.Context, body []byte) error {
	j.g.mu.Lock()
	defer j.g.mu.Unlock()
	j.g.recs[j.name] = append(j.g.recs[j.name], append([]byte(nil), body...))
	return nil
}

func (j gatedJournal) Follow(ctx context.Context, _ time.Time, deliver func([]byte), caughtUp func()) error {
	select {
	case <-j.g.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	j.g.mu.Lock()
	recs := append([][]byte(nil), j.g.recs[j.name]...)
	j.g.mu.Unlock()
	for _, r := range recs {
		deliver(r)
	}
	caughtUp()
	<-ctx.Done()
	return ctx.Err()
}

// A stack consumes (and so claims its queues and partitions) while its journals restore,
// but handles nothing until they have: a message that arrives meanwhile waits; one still
// waiting when the stack closes goes back to its queue unprocessed, and is handled by the
// next instance once.
func TestRun_ConsumesWhileRestoringHandlesAfter(t *testing.T) {
	newStack := func(t *testing.T, b *gatedJournals, handled chan<- string) *router.Stack {
		guard, err := idempotency.New(idempotency.Config{Logger: silentLogger})
		require.NoError(t, err)
		t.Cleanup(func() { _ = guard.Close() })
		s, err := router.New(b, router.Config{Logger: silentLogger, Retry: fastRetries(3), Guard: guard})
		require.NoError(t, err)
		require.NoError(t, s.Handle("charge", "payments", func(msg *message.Message) error {
			handled <- msg.UUID
			return nil
		}))
		return s
	}
	start := func(t *testing.T, s *router.Stack) <-chan error {
		done := make(chan error, 1)
		go func() { done <- s.Run(context.Background()) }()
		select {
		case <-s.Running():
		case err := <-done:
			t.Fatalf("stack stopped at start: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("the stack did not start consuming while its journal restored")
		}
		return done
	}

	t.Run("handles once restored", func(t *testing.T) {
		b := &gatedJournals{testBroker: newTestBroker(t), open: make(chan struct{}), recs: map[string][][]byte{}}
		handled := make(chan string, 4)
		s := newStack(t, b, handled)
		done := start(t, s)
		publish(t, b.testBroker, "payments", "m-1")
		select {
		case id := <-handled:
			t.Fatalf("%s handled before the journal was restored", id)
		case <-time.After(300 * time.Millisecond):
		}
		close(b.open)
		select {
		case id := <-handled:
			assert.Equal(t, "m-1", id)
		case <-time.After(10 * time.Second):
			t.Fatal("not handled once the journal was restored")
		}
		require.NoError(t, s.Close())
		require.NoError(t, <-done)
	})

	t.Run("closed while restoring", func(t *testing.T) {
		b := &gatedJournals{testBroker: newTestBroker(t), open: make(chan struct{}), recs: map[string][][]byte{}}
		handled := make(chan string, 4)
		s := newStack(t, b, handled)
		done := start(t, s)
		publish(t, b.testBroker, "payments", "m-2")
		time.Sleep(100 * time.Millisecond) // delivered, waiting for the restore
		closed := make(chan error, 1)
		go func() { closed <- s.Close() }()
		select {
		case err := <-closed:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Close waited for a restore that cannot end")
		}
		require.NoError(t, <-done)
		assert.Empty(t, handled)

		// The next instance restores and handles it, once.
		close(b.open)
		next := newStack(t, b, handled)
		done = start(t, next)
		select {
		case id := <-handled:
			assert.Equal(t, "m-2", id, "returned to the queue, not lost")
		case <-time.After(10 * time.Second):
			t.Fatal("the message given back at Close was lost")
		}
		require.NoError(t, next.Close())
		require.NoError(t, <-done)
		assert.Empty(t, handled, "handled once")
	})
}

// A guard whose journal is off (idempotency.Config.DisableJournal) is not restored and is
// not described as journaling, even on a broker that keeps journals.
func TestJournal_OffIsNeitherRestoredNorDescribed(t *testing.T) {
	for _, tt := range []struct {
		name        string
		off         bool
		wantJournal string
	}{
		{name: "journal on", wantJournal: "sluice.idempotency.payments"},
		{name: "journal off", off: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The restore never catches up: a stack that waited for it would not handle.
			jb := &gatedJournals{testBroker: newTestBroker(t), open: make(chan struct{}), recs: map[string][][]byte{}}
			guard, err := idempotency.New(idempotency.Config{DisableJournal: tt.off, Logger: silentLogger})
			require.NoError(t, err)
			t.Cleanup(func() { _ = guard.Close() })
			s, err := router.New(jb, router.Config{Logger: silentLogger, Guard: guard})
			require.NoError(t, err)
			handled := make(chan struct{}, 1)
			require.NoError(t, s.Handle("payments", "payments", func(*message.Message) error {
				handled <- struct{}{}
				return nil
			}))
			d := s.Describe()
			require.Len(t, d.Handlers, 1)
			require.NotNil(t, d.Handlers[0].Idempotency)
			assert.Equal(t, tt.wantJournal, d.Handlers[0].Idempotency.Journal)

			serve(t, s)
			publish(t, jb.testBroker, "payments", "p-1")
			select {
			case <-handled:
				assert.True(t, tt.off, "handled before the journal restored")
			case <-time.After(time.Second):
				assert.False(t, tt.off, "a guard with its journal off waited for a restore")
			}
		})
	}
}
