package idempotency

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
)

// A journal record batch, little-endian: the snapshot's records, framed to be checked
// alone.
//
//	magic   [4]byte  "sikj"
//	count   uint32
//	count × { digest [16]byte; expires int64 (Unix ns) }
//	crc     uint32   CRC-32C of everything before it
const (
	journalMagic      = "sikj"
	journalHeaderSize = 4 + 4
	// maxJournalBatch bounds the records one stream message carries (24 KiB of them).
	maxJournalBatch = 1024
)

// ErrJournal is wrapped by the deferral of a message whose work is done but whose
// journal record was not confirmed: the message is not acknowledged until it is.
var ErrJournal = errors.New("idempotency: journal record not confirmed")

// errJournalRecord is counted (Stats.JournalSkipped), never returned: a journal message
// that is not a record batch of this package is skipped.
var errJournalRecord = errors.New("idempotency: not a journal record batch")

// journalAfterAckTimeout bounds the append that follows the ack of a message with
// outputs the router publishes (a plain Watermill router).
const journalAfterAckTimeout = 30 * time.Second

// failLogEvery spaces the journal failure logs of an outage.
const failLogEvery = 10 * time.Second

// maxUnjournaled bounds the keys remembered as done-but-not-journaled; past it a key's
// redelivery is acknowledged as a duplicate without a record (logged).
const maxUnjournaled = 100_000

// journalRetryDeferral is how long a message whose record could not be journaled waits
// broker-side before its next try.
const journalRetryDeferral = time.Second

func encodeBatch(recs []record) []byte {
	b := make([]byte, journalHeaderSize, journalHeaderSize+len(recs)*snapshotRecordSize+4)
	copy(b, journalMagic)
	binary.LittleEndian.PutUint32(b[4:], uint32(len(recs)))
	for _, r := range recs {
		b = append(b, r.key[:]...)
		b = binary.LittleEndian.AppendUint64(b, uint64(r.until()))
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

func decodeBatch(b []byte) ([]record, error) {
	if len(b) < journalHeaderSize+4 || string(b[:4]) != journalMagic {
		return nil, fmt.Errorf("%w: %d bytes without the %q header", errJournalRecord, len(b), journalMagic)
	}
	n := int(binary.LittleEndian.Uint32(b[4:]))
	if want := journalHeaderSize + n*snapshotRecordSize + 4; n > maxJournalBatch || len(b) != want {
		return nil, fmt.Errorf("%w: %d records claimed in %d bytes", errJournalRecord, n, len(b))
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if c := crc32.Checksum(body, crcTable); c != sum {
		return nil, fmt.Errorf("%w: checksum %08x, computed %08x", errJournalRecord, sum, c)
	}
	recs := make([]record, n)
	for i := range recs {
		o := journalHeaderSize + i*snapshotRecordSize
		recs[i].key = digest(b[o : o+16])
		recs[i].exp = int64(binary.LittleEndian.Uint64(b[o+16:]))&^1 | 1
	}
	return recs, nil
}

// journalStats are the Guard's journal counters (Stats).
type journalStats struct {
	restored     atomic.Int64 // records applied before the first caught-up
	restoreNanos atomic.Int64 // the longest restore
	applied      atomic.Int64 // records applied in all
	appended     atomic.Int64 // records confirmed
	batches      atomic.Int64 // stream messages appended
	failures     atomic.Int64 // appends that failed
	skipped      atomic.Int64 // journal messages that were not record batches
	lagNanos     atomic.Int64 // the last record's age when applied
	restoring    atomic.Int64 // journals not caught up yet
	blockedAcks  atomic.Int64 // messages acked unjournaled under a resource alarm
}

// othersJournal is a broker.ResyncingJournal whose follower can leave out the records
// appended through the same Journal value (RabbitMQ's stream journal): FollowOthers is
// FollowResyncing delivering only the records other writers appended.
type othersJournal interface {
	FollowOthers(ctx context.Context, since time.Time, deliver func(body []byte), caughtUp, behind func()) error
}

// journalResyncWait bounds how long handlers wait for a follower that lost its place to
// catch up again (broker.ResyncingJournal), counted from the first message that waits
// (not from the loss: a broker restart can outlast it, and messages arrive only once the
// connection is back): a follower that cannot catch up (its marker cannot be appended
// under a resource alarm) stalls consuming no longer than this.
const journalResyncWait = 5 * time.Second

// journaled is one handler's journal: a group committer appending done keys and a follower
// applying everyone's.
type journaled struct {
	g    *Guard
	j    broker.Journal
	reqs chan *appendReq
	done chan struct{} // both goroutines ended
	// resync is set while the follower catches up after losing its place: keys done
	// elsewhere meanwhile (on another instance, confirmed while this one reconnected) are
	// not applied yet, while the reconnected queue consumer may already hold their
	// redeliveries. Nil while caught up.
	resync atomic.Pointer[resyncState]
}

// resyncState is one catch-up of a follower that lost its place.
type resyncState struct {
	caught chan struct{} // closed once caught up again
	until  atomic.Int64  // when handlers stop waiting for it (Unix ns); 0 until one waits
}

// behind records that the follower lost its place.
func (jd *journaled) behind() {
	st := &resyncState{caught: make(chan struct{})}
	old := jd.resync.Load()
	if old != nil {
		if u := old.until.Load(); u == 0 || time.Now().UnixNano() < u {
			return // a catch-up still awaited: its waiters keep their bound
		}
	}
	// None awaited, or one whose bound passed (its follower never caught up, for
	// example while the journal refused its marker): this loss is waited for afresh.
	if jd.resync.CompareAndSwap(old, st) {
		if old != nil {
			close(old.caught)
		}
		jd.g.cfg.Logger.Debug("idempotency journal: the follower lost its place; handlers wait for it to catch up",
			"max_wait", journalResyncWait)
	}
}

// resynced records that the follower caught up again.
func (jd *journaled) resynced() {
	if st := jd.resync.Swap(nil); st != nil {
		close(st.caught)
	}
}

// waitResync waits, before a message's key is looked up, for a follower that lost its
// place to catch up, so that a key another instance journaled meanwhile is known here;
// at most until the catch-up's bound, ctx's end or the journal's.
func (jd *journaled) waitResync(ctx context.Context) {
	st := jd.resync.Load()
	if st == nil {
		return
	}
	st.until.CompareAndSwap(0, time.Now().Add(journalResyncWait).UnixNano())
	d := time.Until(time.Unix(0, st.until.Load()))
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-st.caught:
	case <-t.C:
	case <-ctx.Done():
	case <-jd.done:
	}
}

type appendReq struct {
	rec    record
	result chan error
}

// Journals reports whether Journaled keeps a journal (Config.DisableJournal unset): the
// stack asks, so that a guard with its journal off is neither restored nor described as
// journaling.
func (g *Guard) Journals() bool { return !g.cfg.DisableJournal }

// Journaled returns the idempotency step (as NewMiddleware) keeping its done keys on j as
// well as in memory, after restoring from j every key done within the TTL: it returns
// once that restore has caught up, so consume only after it. The step then acknowledges a
// message only once the record of its key is confirmed by the broker; records of
// concurrent attempts share one journal message. It follows j until Close, so a key done
// by another instance sharing j is known here too.
//
// With Config.DisableJournal it is NewMiddleware, j unused. The stack (package router)
// calls it for every handler when its broker keeps journals (broker.Journaler), with
// journal sluice.idempotency.<queue>.
func (g *Guard) Journaled(ctx context.Context, jr broker.Journaler, name string, keyFunc func(*message.Message) (string, error), observers ...disposition.Observer) (message.HandlerMiddleware, error) {
	if g.cfg.DisableJournal || jr == nil {
		return g.NewMiddleware(keyFunc, observers...), nil
	}
	jd, err := g.follow(ctx, name, jr.Journal(name, g.cfg.TTL))
	if err != nil {
		return nil, err
	}
	return g.middleware(keyFunc, observers, jd), nil
}

// follow starts j's follower and committer and waits for the restore to catch up.
func (g *Guard) follow(ctx context.Context, name string, j broker.Journal) (*journaled, error) {
	g.waitMu.Lock()
	if g.closed {
		g.waitMu.Unlock()
		return nil, ErrClosed
	}
	jd := &journaled{g: g, j: j, reqs: make(chan *appendReq, maxJournalBatch), done: make(chan struct{})}
	runCtx, cancel := context.WithCancel(context.Background())
	g.journals = append(g.journals, journalStop{cancel: cancel, done: jd.done})
	g.waitMu.Unlock()

	caught := make(chan struct{})
	start := time.Now()
	restoredBefore := g.jst.restored.Load()
	g.jst.restoring.Add(1)
	var restoring atomic.Bool
	restoring.Store(true)
	var wg sync.WaitGroup
	// One committer: measured with 4 (appends in flight together, smaller batches), the
	// full stack consumed 30% slower (BenchmarkConsume, 8 handlers at a time).
	wg.Add(2)
	go func() {
		defer wg.Done()
		jd.commit(runCtx)
	}()
	go func() {
		defer wg.Done()
		deliver := func(body []byte) { g.apply(body, restoring.Load()) }
		since := g.cfg.Now().Add(-g.cfg.TTL)
		first := true // caughtUp runs on Follow's goroutine: no lock
		caughtUp := func() {
			jd.resynced() // a follower that lost its place (even while restoring) is back
			if !first {
				return
			}
			first = false
			restoring.Store(false)
			g.jst.restoring.Add(-1)
			if d := time.Since(start); d > time.Duration(g.jst.restoreNanos.Load()) {
				g.jst.restoreNanos.Store(int64(d))
			}
			close(caught)
		}
		if oj, ok := j.(othersJournal); ok {
			// This step's own records are in its store already (completeAs before the
			// append): reading them back would only cost the broker and this process.
			_ = oj.FollowOthers(runCtx, since, deliver, caughtUp, jd.behind)
			return
		}
		if rj, ok := j.(broker.ResyncingJournal); ok {
			_ = rj.FollowResyncing(runCtx, since, deliver, caughtUp, jd.behind)
			return
		}
		_ = j.Follow(runCtx, since, deliver, caughtUp)
	}()
	go func() {
		wg.Wait()
		close(jd.done)
	}()
	select {
	case <-caught:
		g.cfg.Logger.Info("idempotency keys restored from the journal", "journal", name,
			"keys", g.jst.restored.Load()-restoredBefore, "took", time.Since(start).Round(time.Millisecond))
		return jd, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("idempotency: restore from journal: %w", ctx.Err())
	}
}

// apply adds a batch's live records as done keys.
func (g *Guard) apply(body []byte, restoring bool) {
	recs, err := decodeBatch(body)
	if err != nil {
		g.jst.skipped.Add(1)
		return
	}
	now := g.cfg.Now().UnixNano()
	for _, r := range recs {
		g.store.markDone(r, now)
	}
	g.jst.applied.Add(int64(len(recs)))
	if restoring {
		g.jst.restored.Add(int64(len(recs)))
	} else if len(recs) > 0 {
		// A record is written when its key is done, TTL before it expires.
		g.jst.lagNanos.Store(now - (recs[len(recs)-1].until() - int64(g.cfg.TTL)))
	}
}

// commit appends queued records until ctx ends: whatever queued while one append waited
// for its confirm goes out in the next, as one message.
func (jd *journaled) commit(ctx context.Context) {
	batch := make([]*appendReq, 0, maxJournalBatch)
	recs := make([]record, 0, maxJournalBatch)
	// Records left unconfirmed (an alarm, a failed append) are retried this often.
	retry := time.NewTicker(journalRetryDeferral)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-retry.C:
			jd.g.flushPending(ctx, jd)
			continue
		case r := <-jd.reqs:
			batch = append(batch[:0], r)
		}
	drain:
		for len(batch) < maxJournalBatch {
			select {
			case r := <-jd.reqs:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		recs = recs[:0]
		for _, r := range batch {
			recs = append(recs, r.rec)
		}
		err := jd.j.Append(ctx, encodeBatch(recs))
		if err != nil {
			jd.g.jst.failures.Add(1)
		} else {
			jd.g.jst.batches.Add(1)
			jd.g.jst.appended.Add(int64(len(recs)))
		}
		for _, r := range batch {
			r.result <- err
		}
	}
}

// append journals rec and waits for its confirm, or for ctx.
func (jd *journaled) append(ctx context.Context, rec record) error {
	req, err := jd.send(ctx, rec)
	if err != nil {
		return err
	}
	select {
	case err := <-req.result:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-jd.done:
		return ErrClosed
	}
}

// send queues rec for the committer.
func (jd *journaled) send(ctx context.Context, rec record) (*appendReq, error) {
	req := &appendReq{rec: rec, result: make(chan error, 1)}
	select {
	case jd.reqs <- req:
		return req, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-jd.done:
		return nil, ErrClosed
	}
}

// errAckReleased is the result of a held ack's wait that its subscriber ended (closing).
var errAckReleased = errors.New("idempotency: the subscriber stopped waiting for the journal record")

// await returns req's confirm: the committer answers every request it took, and jd.done
// closes when it stopped; stop (nil: never) ends the wait first.
func (jd *journaled) await(req *appendReq, stop <-chan struct{}) error {
	select {
	case err := <-req.result:
		return err
	case <-jd.done:
		return ErrClosed
	case <-stop:
		return errAckReleased
	}
}

// pendingRecord is a done key's record not confirmed by its journal yet.
type pendingRecord struct {
	rec record
	jd  *journaled
}

// unconfirmed remembers rec as done here but not journaled, for jd's committer to append
// later. While the broker blocks publishing (a memory or disk alarm) the message is
// acknowledged anyway: RabbitMQ wants its queues drained, and the key is known here, so
// only the crash guarantee waits for the alarm to clear. Any other failure returns the
// deferral that keeps the message unacknowledged until a redelivery or the committer
// journals it.
func (g *Guard) unconfirmed(jd *journaled, rec record, err error) error {
	g.logJournalFailure(err)
	g.unjournaledMu.Lock()
	if g.unjournaled == nil {
		g.unjournaled = make(map[digest]pendingRecord)
	}
	if len(g.unjournaled) < maxUnjournaled {
		g.unjournaled[rec.key] = pendingRecord{rec: rec, jd: jd}
	}
	g.unjournaledMu.Unlock()
	if errors.Is(err, broker.ErrBlocked) {
		g.jst.blockedAcks.Add(1)
		return nil
	}
	return sluice.Defer(journalRetryDeferral, fmt.Errorf("%w: %w", ErrJournal, err))
}

// journalPending journals d if it is done here but its record was never confirmed; an
// error is the deferral to return instead of acknowledging the duplicate.
func (g *Guard) journalPending(ctx context.Context, jd *journaled, d digest) error {
	g.unjournaledMu.Lock()
	p, ok := g.unjournaled[d]
	g.unjournaledMu.Unlock()
	if !ok {
		return nil
	}
	if err := jd.append(ctx, p.rec); err != nil {
		g.logJournalFailure(err)
		if errors.Is(err, broker.ErrBlocked) {
			return nil // as in unconfirmed: the committer journals it after the alarm
		}
		return sluice.Defer(journalRetryDeferral, fmt.Errorf("%w: %w", ErrJournal, err))
	}
	g.unjournaledMu.Lock()
	delete(g.unjournaled, d)
	g.unjournaledMu.Unlock()
	return nil
}

// flushPending appends up to a batch of jd's unconfirmed records, dropping those
// confirmed.
func (g *Guard) flushPending(ctx context.Context, jd *journaled) {
	g.unjournaledMu.Lock()
	var recs []record
	for _, p := range g.unjournaled {
		if p.jd == jd {
			recs = append(recs, p.rec)
			if len(recs) == maxJournalBatch {
				break
			}
		}
	}
	g.unjournaledMu.Unlock()
	if len(recs) == 0 {
		return
	}
	if err := jd.j.Append(ctx, encodeBatch(recs)); err != nil {
		g.jst.failures.Add(1)
		return
	}
	g.jst.batches.Add(1)
	g.jst.appended.Add(int64(len(recs)))
	g.unjournaledMu.Lock()
	for _, r := range recs {
		delete(g.unjournaled, r.key)
	}
	g.unjournaledMu.Unlock()
}

// logJournalFailure logs a failed append, at most once per failLogEvery.
func (g *Guard) logJournalFailure(err error) {
	now := time.Now().UnixNano()
	last := g.failLog.Load()
	if now-last < int64(failLogEvery) || !g.failLog.CompareAndSwap(last, now) {
		return
	}
	g.cfg.Logger.Error("idempotency: journal record not confirmed; messages whose work is done are deferred, not acknowledged, until it is",
		"error", err, "failures", g.jst.failures.Load())
}
