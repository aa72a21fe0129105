// Package journal holds a handler's journaled idempotency step until the stack has
// restored its journal (router.Config.Idempotency): the handler is composed at
// registration, its journal read only when the stack runs, and no message is handled
// before the keys done within their TTL are known again.
package journal

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/internal/topology"
)

// Idempotency is the step that journals (package idempotency's Guard).
type Idempotency interface {
	Journaled(ctx context.Context, jr broker.Journaler, name string, key func(*message.Message) (string, error), observers ...disposition.Observer) (message.HandlerMiddleware, error)
}

// Switch is an idempotency step whose journal can be off (package idempotency's Guard with
// Config.DisableJournal): Journals reports whether it keeps one.
type Switch interface {
	Journals() bool
}

// ErrRestoring is the reason of a message returned unprocessed because the stack closed
// (or its restore failed) before its idempotency journal was restored.
var ErrRestoring = errors.New("router: idempotency journal not restored")

// Slot holds one handler's journaled idempotency step until Restore has restored it.
type Slot struct {
	ji   Idempotency
	jr   broker.Journaler
	name string
	key  func(*message.Message) (string, error)
	obs  []disposition.Observer
	next message.HandlerFunc // the steps below idempotency
	// ready is closed once Restore has set step (nil when the restore failed); closing
	// is closed by the stack's Close.
	ready   chan struct{}
	closing <-chan struct{}
	step    message.HandlerFunc
}

// NewSlot returns the slot of queue's journal, restored through ji from jr, for a handler
// with key function key (nil: the step's own) and observers obs.
func NewSlot(ji Idempotency, jr broker.Journaler, queue string, key func(*message.Message) (string, error), obs []disposition.Observer, closing <-chan struct{}) *Slot {
	return &Slot{ji: ji, jr: jr, name: queue, key: key, obs: obs, ready: make(chan struct{}), closing: closing}
}

// Queue is the consumed queue whose journal the slot holds.
func (sl *Slot) Queue() string { return sl.name }

// WithKey reports whether the handler gave a key function.
func (sl *Slot) WithKey() bool { return sl.key != nil }

// Gate holds a message until the journal is restored. It stands outside the attempt step:
// waiting for the restore is not the handler's time.
func (sl *Slot) Gate(next message.HandlerFunc) message.HandlerFunc {
	return func(m *message.Message) ([]*message.Message, error) {
		select {
		case <-sl.ready:
		default:
			// Claimed before the journal is read: wait, holding the message, rather than
			// handle it without the keys a peer or an earlier run marked done.
			select {
			case <-sl.ready:
			case <-sl.closing:
				return nil, markers.ReturnUnprocessed(fmt.Errorf("%w: queue %q: the stack is closing", ErrRestoring, sl.name))
			case <-m.Context().Done():
				return nil, markers.ReturnUnprocessed(fmt.Errorf("%w: queue %q: %w", ErrRestoring, sl.name, m.Context().Err()))
			}
		}
		if sl.step == nil {
			return nil, markers.ReturnUnprocessed(fmt.Errorf("%w: queue %q: the restore failed", ErrRestoring, sl.name))
		}
		return next(m)
	}
}

// Middleware is the journaled idempotency step, once Gate let the message through.
func (sl *Slot) Middleware(next message.HandlerFunc) message.HandlerFunc {
	sl.next = next
	return func(m *message.Message) ([]*message.Message, error) { return sl.step(m) }
}

// Restore restores every slot's journal at once: a partitioned handler has a journal per
// partition, and the instances started together claim partitions only once consuming, so
// the restore's length should not grow with the partitions.
func Restore(ctx context.Context, slots []*Slot) error {
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

// Restoring is one Run's restore of its journals, beside consuming.
type Restoring struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Stop ends the restore and waits for it: the stack's Close.
func (r *Restoring) Stop() {
	r.cancel()
	<-r.done
}

// Done is closed once the restore has ended.
func (r *Restoring) Done() <-chan struct{} { return r.done }

// Run consumes (run, the stack's router) and restores the journals (restore) at once: a
// partitioned handler claims its partitions as early as its peers, while its messages wait
// at their slot's Gate. It returns run's result; or, when the restore fails, restore's
// error, once closeRouter has given the messages waiting for it back unprocessed. A
// restore that closing (the stack's Close) ended is not a failure. started is given the
// Restoring before either begins.
func Run(ctx context.Context, run func(context.Context) error, restore func(context.Context) error, closeRouter func() error,
	closing <-chan struct{}, started func(*Restoring)) error {
	restoreCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &Restoring{cancel: cancel, done: make(chan struct{})}
	started(r)
	restored := make(chan error, 1)
	go func() {
		defer close(r.done)
		restored <- restore(restoreCtx)
	}()
	ran := make(chan error, 1)
	go func() { ran <- run(ctx) }()
	select {
	case err := <-restored:
		select {
		case <-closing:
			return <-ran // Close ended the restore: not a failure
		default:
		}
		if err != nil {
			_ = closeRouter()
			<-ran //nolint:errcheck // run's own end is superseded by the restore's failure, err
			return err
		}
		return <-ran
	case err := <-ran:
		cancel()
		<-restored //nolint:errcheck // the caller hears run's end, not the cancelled restore's
		return err
	}
}
