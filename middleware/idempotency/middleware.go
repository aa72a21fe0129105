package idempotency

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/attempt"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/internal/otelnames"
)

// ErrInFlight is the reason of the markers.Defer returned for a duplicate whose key is
// being processed by another attempt.
var ErrInFlight = errors.New("idempotency: key in flight")

// ErrStillRunning is matched (errors.Is) by the retryable failure of a message whose key
// is held by an attempt the stack abandoned at its handler timeout and whose handler has
// not returned yet (error type sluice.still_running): running the handler beside it could
// do the work twice, and deferring for free could defer for ever, so it uses an attempt
// and ends in the dead-letter queue once the retries are spent.
var ErrStillRunning = markers.ErrStillRunning

// stillRunningError is ErrStillRunning's failure for one message.
type stillRunningError struct{ id string }

func (e *stillRunningError) Error() string {
	return "message " + e.id + ": its idempotency key is held by an abandoned attempt still running"
}
func (e *stillRunningError) ErrorType() string { return "sluice.still_running" }
func (e *stillRunningError) Is(err error) bool { return err == ErrStillRunning }

// ErrKey is matched (errors.Is) by the permanent error returned when the key function
// fails.
var ErrKey = errors.New("idempotency: cannot derive key")

// maxKeyAttr bounds the key recorded on span events.
const maxKeyAttr = 128

// Where a message's key came from. Keys from metadata and from KeyFunc share one namespace
// (both are business keys, and producers may set either); message ids have their own, so
// that a business key never matches an unrelated message's id.
const (
	sourceMetadata  = "metadata"
	sourceKeyFunc   = "key_func"
	sourceMessageID = "message_id"
)

// Guard is the idempotency step: a watermill handler middleware over a Store.
type Guard struct {
	cfg       Config
	store     *Store
	keyErrors atomic.Uint64
	noKey     atomic.Uint64

	stop      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once

	// Keys whose outputs the router still publishes wait for its ack (completeOnAck).
	waitMu   sync.Mutex
	closed   bool
	closing  chan struct{}
	waiters  sync.WaitGroup
	journals []journalStop // Journaled's goroutines, stopped by Close

	jst journalStats
	// unjournaled holds keys done here whose journal record was not confirmed: their
	// message was deferred, and its redelivery journals the key before acking.
	unjournaledMu sync.Mutex
	unjournaled   map[digest]pendingRecord
	failLog       atomic.Int64 // when the last journal failure was logged (Unix ns)

	// held counts, per key, the abandoned attempts (package internal/attempt) still
	// running with it: they keep it whatever their lease says.
	heldMu sync.Mutex
	held   map[digest]int
}

// journalStop ends one Journaled's goroutines.
type journalStop struct {
	cancel func()
	done   <-chan struct{}
}

// ErrClosed is returned by Journaled after Close, and by a journal append the Close
// interrupted.
var ErrClosed = errors.New("idempotency: guard closed")

// New returns a Guard with a new Store configured by cfg; with cfg.SnapshotPath set, the
// snapshot is loaded now if the file exists, and written by Close.
func New(cfg Config) (*Guard, error) {
	st, err := newStore(cfg)
	if err != nil {
		return nil, err
	}
	cfg.setDefaults()
	g := &Guard{cfg: cfg, store: st, closing: make(chan struct{})}
	if cfg.SnapshotPath != "" && cfg.SnapshotInterval > 0 {
		g.stop, g.stopped = make(chan struct{}), make(chan struct{})
		go g.snapshotLoop()
	}
	return g, nil
}

// snapshotLoop writes the snapshot every SnapshotInterval until Close.
func (g *Guard) snapshotLoop() {
	defer close(g.stopped)
	t := time.NewTicker(g.cfg.SnapshotInterval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
			// A failed write keeps the previous snapshot (writes are atomic); the next
			// tick or Close tries again.
			_ = g.store.SaveSnapshot(g.cfg.SnapshotPath)
		}
	}
}

// Store returns the Guard's store, for its counters, size and sweep.
func (g *Guard) Store() *Store { return g.store }

// Stats returns the store's counters and the Guard's own.
func (g *Guard) Stats() Stats {
	st := g.store.Stats()
	st.KeyErrors = g.keyErrors.Load()
	st.NoKey = g.noKey.Load()
	st.Journal = JournalStats{
		Restoring:       int(g.jst.restoring.Load()),
		Restored:        g.jst.restored.Load(),
		RestoreDuration: time.Duration(g.jst.restoreNanos.Load()),
		Applied:         g.jst.applied.Load(),
		Appended:        g.jst.appended.Load(),
		Batches:         g.jst.batches.Load(),
		Failures:        g.jst.failures.Load(),
		Skipped:         g.jst.skipped.Load(),
		Lag:             time.Duration(g.jst.lagNanos.Load()),
		BlockedAcks:     g.jst.blockedAcks.Load(),
	}
	g.unjournaledMu.Lock()
	st.Journal.Unconfirmed = len(g.unjournaled)
	g.unjournaledMu.Unlock()
	return st
}

// Close closes the store, writing its snapshot if configured. Call it after the router
// has stopped, so that the last completions are in the snapshot.
func (g *Guard) Close() error {
	g.closeOnce.Do(func() {
		g.waitMu.Lock()
		g.closed = true
		close(g.closing)
		g.waitMu.Unlock()
		g.waiters.Wait()
		for _, j := range g.journals {
			j.cancel()
			<-j.done
		}
		if g.stop != nil {
			close(g.stop)
			<-g.stopped
		}
	})
	return g.store.Close()
}

// Middleware is the idempotency step with Config.KeyFunc, for a plain Watermill router:
// r.AddMiddleware(g.Middleware). See NewMiddleware.
func (g *Guard) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return g.wrap(h, g.cfg.KeyFunc, nil, nil)
}

// NewMiddleware returns the idempotency step as a watermill message.HandlerMiddleware whose
// key function is keyFunc, or Config.KeyFunc when keyFunc is nil; the stack calls it with
// each handler's router.WithIdempotencyKey.
//
// A message's key is its idempotency-key metadata, else the key function's result, else
// the message id, scoped by the handler name in the message context (so two handlers that
// consume copies of one event each process it). Then:
//   - a key done within its TTL: the message is acknowledged without calling the handler,
//     counted, passed to Config.OnDuplicate and to each of observers as a
//     disposition.Duplicate outcome;
//   - a key in flight: sluice.Defer(InFlightDeferral or the rest of the lease, ErrInFlight),
//     never a wait in-process;
//   - otherwise the handler runs holding the key, released on any error or panic so that
//     the retry runs. On success with no output messages (in the sluice stack, or behind
//     router.Middlewares, the output step below has published and confirmed them) the key
//     is marked done at once. On success with output messages the router still has to
//     publish them: the key is marked done only once the router acks the message, and
//     released if it nacks it (a failed output publish), so that the redelivery runs the
//     handler again instead of being acked as a duplicate.
//
// A message with no key at all (no metadata, no key function result, empty id) is handled
// without idempotency.
func (g *Guard) NewMiddleware(keyFunc func(*message.Message) (string, error), observers ...disposition.Observer) message.HandlerMiddleware {
	return g.middleware(keyFunc, observers, nil)
}

// middleware is the step with keyFunc (Config.KeyFunc when nil) and observers, journaled
// on jd when it is not nil.
func (g *Guard) middleware(keyFunc func(*message.Message) (string, error), observers []disposition.Observer, jd *journaled) message.HandlerMiddleware {
	if keyFunc == nil {
		keyFunc = g.cfg.KeyFunc
	}
	var obs disposition.Observer
	if len(observers) > 0 {
		obs = disposition.Observers(observers)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return g.wrap(h, keyFunc, obs, jd)
	}
}

// wrap is the step over h; with jd, keys done are journaled before their message is
// acknowledged.
func (g *Guard) wrap(h message.HandlerFunc, keyFunc func(*message.Message) (string, error), obs disposition.Observer, jd *journaled) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		key, source, err := deriveKey(msg, keyFunc)
		if err != nil {
			g.keyErrors.Add(1)
			return nil, err
		}
		if key == "" {
			g.noKey.Add(1)
			return h(msg)
		}
		ctx := msg.Context()
		if jd != nil {
			// After a lost journal consumer, keys done elsewhere meanwhile are known only
			// once the follower has caught up again.
			jd.waitResync(ctx)
		}
		d := scopedDigest(message.HandlerNameFromCtx(ctx), source, key)
		lease, status, remaining := g.store.begin(d)
		if status != keyDone && g.heldByAbandoned(d) {
			// In flight, or free only because the abandoned holder's lease ran out.
			if status == keyAcquired {
				g.store.release(lease)
			}
			return nil, &stillRunningError{id: msg.UUID}
		}
		switch status {
		case keyDone:
			if jd != nil {
				if err := g.journalPending(ctx, jd, d); err != nil {
					return nil, err
				}
			}
			if g.cfg.OnDuplicate != nil {
				g.cfg.OnDuplicate(msg, key)
			}
			if span := trace.SpanFromContext(ctx); span.IsRecording() {
				span.AddEvent(otelnames.EventIdempotencyDuplicate, trace.WithAttributes(keyAttrs(key, source)...))
			}
			if obs != nil {
				obs.Observe(ctx, disposition.Outcome{
					Disposition: disposition.Disposition{Kind: disposition.Duplicate},
					Attempt:     sluice.RetryCount(msg.Metadata) + 1,
					Queue:       message.SubscribeTopicFromCtx(ctx), Handler: message.HandlerNameFromCtx(ctx), MessageID: msg.UUID,
				})
			}
			return nil, nil
		case keyInFlight:
			d := min(g.cfg.InFlightDeferral, remaining)
			if span := trace.SpanFromContext(ctx); span.IsRecording() {
				span.AddEvent(otelnames.EventIdempotencyInFlight, trace.WithAttributes(
					append(keyAttrs(key, source), attribute.Int64("idempotency.defer_ms", d.Milliseconds()))...))
			}
			return nil, sluice.Defer(d, ErrInFlight)
		}

		succeeded, pending := false, false
		// An attempt the stack abandons keeps the key until its handler returns.
		var endHold func() bool
		if st := attempt.From(ctx); st != nil {
			endHold = st.Track(func() { g.hold(d, 1) })
		}
		// Deferred so that a panic (turned into an error by the recoverer outside) releases
		// the key too, instead of holding it until the lease runs out.
		defer func() {
			switch {
			case pending:
			case succeeded:
				g.store.complete(lease)
			default:
				g.store.release(lease)
			}
			if endHold != nil && endHold() {
				g.hold(d, -1)
			}
		}()
		out, err := h(msg)
		succeeded = err == nil
		switch {
		case succeeded && len(out) > 0:
			pending = g.completeOnAck(msg, lease, jd)
		case succeeded && jd != nil:
			// The key stays in flight until its record is confirmed, so a duplicate
			// arriving meanwhile is deferred, not acknowledged on an unjournaled key.
			pending = true
			rec := g.store.doneRecord(lease)
			req, jerr := jd.send(ctx, rec)
			if jerr == nil && broker.DeliveryFrom(ctx).HoldAck(func(stop <-chan struct{}) error { return g.journaledDone(jd, lease, rec, jd.await(req, stop)) }) {
				// The subscriber acknowledges once the record is confirmed, and the
				// handler's slot takes the next message meanwhile.
				return out, nil
			}
			if jerr == nil {
				jerr = jd.await(req, nil)
			}
			if err := g.journaledDone(jd, lease, rec, jerr); err != nil {
				return nil, err
			}
		}
		return out, err
	}
}

// hold counts an abandoned attempt holding d (n = 1) or returning (n = -1).
func (g *Guard) hold(d digest, n int) {
	g.heldMu.Lock()
	defer g.heldMu.Unlock()
	if g.held == nil {
		g.held = map[digest]int{}
	}
	if g.held[d] += n; g.held[d] <= 0 {
		delete(g.held, d)
	}
}

// heldByAbandoned reports whether an abandoned attempt still running holds d.
func (g *Guard) heldByAbandoned(d digest) bool {
	g.heldMu.Lock()
	defer g.heldMu.Unlock()
	return g.held[d] > 0
}

func deriveKey(msg *message.Message, keyFunc func(*message.Message) (string, error)) (key, source string, err error) {
	if k := msg.Metadata.Get(sluice.HeaderIdempotencyKey); k != "" {
		return k, sourceMetadata, nil
	}
	if keyFunc != nil {
		k, err := keyFunc(msg)
		if err != nil {
			return "", "", sluice.Permanent(&keyError{MessageID: msg.UUID, Err: err})
		}
		if k != "" {
			return k, sourceKeyFunc, nil
		}
	}
	return msg.UUID, sourceMessageID, nil
}

// scopedDigest hashes scope, namespace and key without allocating for usual sizes.
func scopedDigest(scope, source, key string) digest {
	var buf [192]byte
	b := append(buf[:0], scope...)
	b = append(b, 0)
	if source == sourceMessageID {
		b = append(b, 'm')
	} else {
		b = append(b, 'k')
	}
	b = append(b, key...)
	return sumBytes(b)
}

func keyAttrs(key, source string) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("idempotency.key", failure.Truncate(key, maxKeyAttr)),
		attribute.String("idempotency.key_source", source),
	}
}

// journaledDone completes lease once its record's append returned jerr: nil to acknowledge
// the message, else what unconfirmed says (the deferral that keeps it unacknowledged until
// the record is journaled; nil under a resource alarm).
func (g *Guard) journaledDone(jd *journaled, lease keyLease, rec record, jerr error) error {
	g.store.completeAs(lease, rec)
	if jerr != nil {
		return g.unconfirmed(jd, rec, jerr)
	}
	return nil
}

// completeOnAck marks lease done when the router acks msg and releases it when the router
// nacks it, or when the Guard closes first. It reports false, leaving the lease to the
// caller, when the Guard is closed already.
func (g *Guard) completeOnAck(msg *message.Message, lease keyLease, jd *journaled) bool {
	g.waitMu.Lock()
	defer g.waitMu.Unlock()
	if g.closed {
		return false
	}
	g.waiters.Add(1)
	go func() {
		defer g.waiters.Done()
		select {
		case <-msg.Acked():
			if jd == nil {
				g.store.complete(lease)
				return
			}
			// The router publishes the outputs after this step, so the record can only
			// follow the ack here (see Journaled).
			rec := g.store.doneRecord(lease)
			g.store.completeAs(lease, rec)
			ctx, cancel := context.WithTimeout(context.Background(), journalAfterAckTimeout)
			defer cancel()
			if err := jd.append(ctx, rec); err != nil {
				g.logJournalFailure(err)
			}
		case <-msg.Nacked():
			g.store.release(lease)
		case <-g.closing:
			g.store.release(lease)
		}
	}()
	return true
}
