package router

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/topology"
)

// JournalingIdempotency is an Idempotency that also keeps its done keys on a broker's
// journal (idempotency.Guard does). When the stack's broker keeps journals
// (broker.Journaler: RabbitMQ), Run gives every handler's step the journal
// sluice.idempotency.<queue> of the queue it consumes (one per partition of a partitioned
// handler). Consuming starts at once (a partitioned handler claims its partitions as
// early as its peers), but no message is handled until every journal has restored the keys
// done within their TTL: a message that arrives meanwhile waits, unacknowledged, and is
// returned unprocessed when the stack closes first. /readyz (otelsetup.Operate) says
// "restoring" meanwhile. Middlewares, for a router of the user's own, does not journal.
type JournalingIdempotency interface {
	Idempotency
	// Journaled returns the step keeping its done keys on jr's journal name, once it has
	// restored them.
	Journaled(ctx context.Context, jr broker.Journaler, name string, key func(*message.Message) (string, error), observers ...disposition.Observer) (message.HandlerMiddleware, error)
}

// journalSwitch is an idempotency step whose journal can be off (package idempotency's
// Guard with Config.DisableJournal): Journals reports whether it keeps one.
type journalSwitch interface {
	Journals() bool
}

// journalSlot holds a handler's journaled idempotency step until Run has restored it: the
// handler is composed at registration, its journal read only when the stack runs.
type journalSlot struct {
	ji   JournalingIdempotency
	jr   broker.Journaler
	name string
	key  func(*message.Message) (string, error)
	obs  []disposition.Observer
	next message.HandlerFunc // the steps below idempotency
	// ready is closed once restoreJournals has set step (nil when the restore failed);
	// closing is closed by Stack.Close.
	ready   chan struct{}
	closing <-chan struct{}
	step    message.HandlerFunc
}

// ErrRestoring is the reason of a message returned unprocessed because the stack closed
// (or its restore failed) before its idempotency journal was restored.
var ErrRestoring = errors.New("router: idempotency journal not restored")

// gate holds a message until the journal is restored. It stands outside the attempt step:
// waiting for the restore is not the handler's time.
func (sl *journalSlot) gate(next message.HandlerFunc) message.HandlerFunc {
	return func(m *message.Message) ([]*message.Message, error) {
		select {
		case <-sl.ready:
		default:
			// Claimed before the journal is read: wait, holding the message, rather than
			// handle it without the keys a peer or an earlier run marked done.
			select {
			case <-sl.ready:
			case <-sl.closing:
				return nil, disposition.ReturnUnprocessedError(fmt.Errorf("%w: queue %q: the stack is closing", ErrRestoring, sl.name))
			case <-m.Context().Done():
				return nil, disposition.ReturnUnprocessedError(fmt.Errorf("%w: queue %q: %w", ErrRestoring, sl.name, m.Context().Err()))
			}
		}
		if sl.step == nil {
			return nil, disposition.ReturnUnprocessedError(fmt.Errorf("%w: queue %q: the restore failed", ErrRestoring, sl.name))
		}
		return next(m)
	}
}

// middleware is the journaled idempotency step, once gate let the message through.
func (sl *journalSlot) middleware(next message.HandlerFunc) message.HandlerFunc {
	sl.next = next
	return func(m *message.Message) ([]*message.Message, error) { return sl.step(m) }
}

// journalSlot returns a slot for hc's idempotency step when it journals, else nil.
func (s *Stack) journalSlot(hc handlerConfig, obs []disposition.Observer) *journalSlot {
	if hc.journal == "" {
		return nil
	}
	jr, ok := s.broker.(broker.Journaler)
	if !ok {
		return nil
	}
	ji, ok := s.cfg.Idempotency.(JournalingIdempotency)
	if !ok {
		return nil
	}
	if j, ok := ji.(journalSwitch); ok && !j.Journals() {
		return nil // its journal is off: NewMiddleware, with nothing to restore
	}
	sl := &journalSlot{ji: ji, jr: jr, name: hc.journal, key: hc.keyFunc, obs: obs,
		ready: make(chan struct{}), closing: s.closing}
	s.slots = append(s.slots, sl)
	return sl
}

// restoreJournals restores every handler's idempotency journal.
func (s *Stack) restoreJournals(ctx context.Context) error {
	s.mu.Lock()
	slots := s.slots
	s.mu.Unlock()
	if len(slots) == 0 {
		return nil
	}
	const pauser = "idempotency"
	s.pauses.Pause(pauser, fmt.Sprintf("restoring idempotency keys from %d journal(s)", len(slots)))
	defer s.pauses.Resume(pauser)
	// All at once: a partitioned handler has a journal per partition, and the instances
	// started together claim partitions only once consuming, so the restore's length
	// should not grow with the partitions (nor differ much between instances).
	errs := make([]error, len(slots))
	var wg sync.WaitGroup
	for i, sl := range slots {
		select {
		case <-sl.ready:
			continue // a second Run
		default:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(sl.ready)
			mw, err := sl.ji.Journaled(ctx, sl.jr, topology.IdempotencyJournal(sl.name), sl.key, sl.obs...)
			if err != nil {
				errs[i] = fmt.Errorf("router: idempotency journal of queue %q: %w", sl.name, err)
				return
			}
			sl.step = mw(sl.next)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
