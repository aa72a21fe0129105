package amqp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/broker"
)

// Journal limits. A stream keeps whole segments: the small segment size lets retention
// drop old records soon after they pass their age, instead of 500 MB at a time.
const (
	// journalMaxBytes bounds a journal stream's size beside its age (x-max-length-bytes):
	// 1 GiB holds some 40 million keys at the idempotency step's 24 bytes a key.
	journalMaxBytes = 1 << 30
	// journalSegmentBytes is x-stream-max-segment-size-bytes.
	journalSegmentBytes = 8 << 20
	// journalPrefetch is the stream consumer's prefetch (a stream consumer must set one).
	journalPrefetch = 1000
	// journalAckEvery is how many stream deliveries one multiple ack grants credit for.
	journalAckEvery = journalPrefetch / 4
	// journalRetry is the pause before Follow consumes again after losing its consumer.
	journalRetry = 500 * time.Millisecond
	// journalStreamSettle is how long a stream created on RabbitMQ 3.x is left before
	// the first publish to it (streamWriterLags); its writer registers within tens of
	// milliseconds on an idle node.
	journalStreamSettle = 500 * time.Millisecond
	// journalContentType marks a journal record.
	journalContentType = "application/vnd.sluice.journal"
	// headerJournalMarker marks a Follow's own position marker, not a record.
	headerJournalMarker = "x-sluice-journal-marker"
	// headerJournalWriter names the Journal value an append came through (its writer id),
	// headerJournalSeq numbers that writer's appends: a follower of the same Journal knows
	// its own records by them (FollowOthers).
	headerJournalWriter = "x-sluice-journal-writer"
	headerJournalSeq    = "x-sluice-journal-seq"
	// headerStreamFilterValue is RabbitMQ's stream filter value (3.13 and later): each
	// chunk's Bloom filter holds its messages' values, and a consumer that names values
	// (x-stream-filter) is sent only the chunks that may hold them.
	headerStreamFilterValue = "x-stream-filter-value"
	// The filter values of a record and of a marker.
	journalFilterRecord = "sluice.record"
	journalFilterMarker = "sluice.marker"
	// journalHelloGap is H in "Reading only what others wrote" (FollowOthers): an append
	// whose writer has not had an append confirmed for longer than this is preceded by a
	// marker, which every follower reads.
	journalHelloGap = 10 * time.Second
	// journalOwnFresh bounds the age of the newest own append a follower must have read
	// back before it stops reading records (FollowOthers): proof that it is not lagging.
	journalOwnFresh = 10 * time.Second
	// journalQuietCheck is how often a follower that reads everything checks whether it
	// may read markers only.
	journalQuietCheck = time.Second
	// journalWriterSlots is how many of its own appends' start times a journal remembers
	// until its follower reads them back.
	journalWriterSlots = 1024
	// journalProbeEvery is how often a follower reading markers only appends one: the
	// offset it reads back is where a consumer lost meanwhile resumes, so that RabbitMQ does
	// not scan every chunk of the hours it may have been reading markers only.
	journalProbeEvery = 10 * time.Second
)

// settle waits, on RabbitMQ 3.x, for a new stream's writer. 3.x answers declare-ok
// before the writer is registered: a publish in that gap crashes its channel
// (osiris_writer:write(none, ...)), and the 541 INTERNAL_ERROR closes the publishing
// connection with every publish in flight on it (seen on 3.10.8, the stream created on a
// fresh node by one instance and published to by another at once). Streams are created
// rarely (a first start, a deleted journal), so a fixed pause is the whole remedy.
func (j *streamJournal) settle(ctx context.Context) error {
	if !streamWriterLags(j.b.conn.current()) {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(journalStreamSettle):
		return nil
	}
}

// streamWriterLags reports whether conn's node is RabbitMQ 3.x, whose new streams take
// publishes only a moment after declare-ok (journalStreamSettle).
func streamWriterLags(conn *amqp.Connection) bool {
	if conn == nil {
		return false
	}
	return strings.HasPrefix(nodeVersion(conn), "3.")
}

// errJournalCancelled is a journal consumer cancelled by RabbitMQ.
var errJournalCancelled = errors.New("consumer cancelled by RabbitMQ")

// errJournalDeclare wraps a failure to declare a journal stream.
var errJournalDeclare = errors.New("amqp: declare journal stream")

// Journal returns the RabbitMQ stream name as a journal (broker.Journaler): records are
// persistent messages appended with publisher confirms through the broker's publisher, and
// read with a stream consumer (x-stream-offset) on the consuming connection. The stream is
// declared on first use with x-max-age retention and journalMaxBytes; a stream deleted under
// a running journal is declared again, logged at error level and counted (journalStats).
//
// Every append carries the writer id of the Journal value it came through, and its
// follower started with FollowOthers delivers only the records other writers appended
// (see FollowOthers).
func (b *Broker) Journal(name string, retention time.Duration) broker.Journal {
	return &streamJournal{b: b, name: name, retention: retention, writer: newWriterID()}
}

// newWriterID returns a random journal writer id: 16 hex digits.
func newWriterID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

var (
	_ broker.Journaler        = (*Broker)(nil)
	_ broker.JournalRecreator = (*Broker)(nil)
	// The idempotency step waits for a stream journal's follower to find its place
	// again after a lost consumer.
	_ broker.ResyncingJournal = (*streamJournal)(nil)
)

type streamJournal struct {
	b         *Broker
	name      string
	retention time.Duration
	declared  atomic.Bool
	writer    string // this Journal value's writer id, on every append

	// appendMu serializes appends, so that each one knows whether the one before it was
	// confirmed and when (the marker rule of FollowOthers).
	appendMu sync.Mutex
	seq      uint64    // the last append's number; under appendMu
	lastOK   time.Time // when the last append's confirm arrived; zero if it failed; under appendMu
	// started remembers when each of the last journalWriterSlots appends started, by
	// number, for the follower that reads them back.
	startedMu sync.Mutex
	started   [journalWriterSlots]appendStart

	recreated atomic.Int64
	resumed   atomic.Int64
	markers   atomic.Int64 // markers appended before a record (the writer had been quiet)
	filtered  atomic.Bool  // the follower reads markers only
	switches  atomic.Int64 // times the follower started reading markers only
	ownRead   atomic.Int64 // own records the follower was sent back
}

// appendStart is when append number seq started.
type appendStart struct {
	seq uint64
	at  time.Time
}

// JournalsRecreated counts the journal streams (of every Journal of b) found deleted under
// a running journal and declared again.
func (b *Broker) JournalsRecreated() int64 { return b.journalsRecreated.Load() }

// journalStats counts what a journal had to repair, and how its follower reads.
type journalStats struct {
	// Recreated counts the times the stream was found deleted and declared again.
	Recreated int64
	// Resumed counts the times Follow consumed again after losing its consumer
	// (connection loss, broker restart, stream deleted).
	Resumed int64
	// MarkersOnly says whether the follower (FollowOthers) reads only markers now, no
	// other writer being active: RabbitMQ 3.13 and later leave this journal's own records
	// out broker-side. MarkersOnlySwitches counts the times it started to.
	MarkersOnly         bool
	MarkersOnlySwitches int64
	// HelloMarkers counts the markers appended before a record because this writer had had
	// no append confirmed for journalHelloGap.
	HelloMarkers int64
	// OwnRecordsRead counts the records appended through this journal that RabbitMQ sent
	// its follower back (FollowOthers leaves them out of what it delivers).
	OwnRecordsRead int64
}

// journalStatsOf returns what j had to repair, and false when j did not come from
// Broker.Journal.
func journalStatsOf(j broker.Journal) (journalStats, bool) {
	sj, ok := j.(*streamJournal)
	if !ok {
		return journalStats{}, false
	}
	return journalStats{Recreated: sj.recreated.Load(), Resumed: sj.resumed.Load(),
		MarkersOnly: sj.filtered.Load(), MarkersOnlySwitches: sj.switches.Load(), HelloMarkers: sj.markers.Load(),
		OwnRecordsRead: sj.ownRead.Load()}, true
}

func (j *streamJournal) args() amqp.Table {
	// x-max-age takes whole seconds with a unit; round up so retention is never shorter.
	secs := max(int64((j.retention+time.Second-1)/time.Second), 1)
	return amqp.Table{
		"x-queue-type":                    "stream",
		"x-max-age":                       fmt.Sprintf("%ds", secs),
		"x-max-length-bytes":              int64(journalMaxBytes),
		"x-stream-max-segment-size-bytes": int64(journalSegmentBytes),
	}
}

// declare declares the stream, reporting whether it had to be created. A passive declare
// first tells a missing stream (created now, loudly when it existed before) from one that
// is there.
func (j *streamJournal) declare(ctx context.Context) (created bool, err error) {
	ch, err := j.b.conn.channel(ctx)
	if err != nil {
		return false, fmt.Errorf("%w %q: %w", errJournalDeclare, j.name, err)
	}
	if q, perr := ch.QueueDeclarePassive(j.name, true, false, false, false, nil); perr == nil {
		_ = ch.Close()
		if q.Messages == 0 {
			// Perhaps just declared by another instance (see settle).
			if err := j.settle(ctx); err != nil {
				return false, err
			}
		}
		j.declared.Store(true)
		return false, nil
	} else if e := new(amqp.Error); !errors.As(perr, &e) || e.Code != amqp.NotFound {
		_ = ch.Close()
		return false, fmt.Errorf("%w %q: %w", errJournalDeclare, j.name, perr)
	}
	// The passive declare's 404 closed the channel.
	ch, err = j.b.conn.channel(ctx)
	if err != nil {
		return false, fmt.Errorf("%w %q: %w", errJournalDeclare, j.name, err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(j.name, true, false, false, false, j.args()); err != nil {
		return false, fmt.Errorf("%w %q: %w", errJournalDeclare, j.name, err)
	}
	if err := j.settle(ctx); err != nil {
		return false, err
	}
	if j.declared.Swap(true) {
		j.recreated.Add(1)
		j.b.journalsRecreated.Add(1)
		j.b.cfg.Logger.Error("idempotency journal stream was deleted under a running service; declared it again (records before the deletion are lost: keys done only there are forgotten)",
			"stream", j.name)
	}
	return true, nil
}

func (j *streamJournal) ensure(ctx context.Context) error {
	if j.declared.Load() {
		return nil
	}
	_, err := j.declare(ctx)
	return err
}

// Append publishes body to the stream, confirmed. A stream deleted meanwhile makes the
// publish unroutable: it is declared again and the record published once more.
func (j *streamJournal) Append(ctx context.Context, body []byte) error {
	// Under a memory or disk alarm a publish would wait for the alarm to clear; the caller
	// decides what to do meanwhile (the idempotency step keeps consuming: see Journaled).
	if err := j.b.pubConn.blockedErr(); err != nil {
		return fmt.Errorf("append to journal %q: %w", j.name, err)
	}
	j.appendMu.Lock()
	defer j.appendMu.Unlock()
	if j.lastOK.IsZero() || time.Since(j.lastOK) > journalHelloGap {
		// Followers of other instances that read markers only learn from it that this
		// writer is active (FollowOthers).
		if err := j.appendLocked(ctx, markerPublishing(uuid.NewString())); err != nil {
			return err
		}
		j.markers.Add(1)
	}
	return j.appendLocked(ctx, amqp.Publishing{
		ContentType:  journalContentType,
		DeliveryMode: amqp.Persistent,
		Timestamp:    time.Now(),
		Headers:      amqp.Table{headerStreamFilterValue: journalFilterRecord},
		Body:         body,
	})
}

// markerPublishing is a position marker.
func markerPublishing(marker string) amqp.Publishing {
	return amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		Headers:      amqp.Table{headerJournalMarker: marker, headerStreamFilterValue: journalFilterMarker},
	}
}

// appendLocked publishes pub as this writer's next append, its confirm awaited within
// Config.PublishTimeout of its start whatever ctx's deadline (FollowOthers counts on that
// bound). The caller holds appendMu.
func (j *streamJournal) appendLocked(ctx context.Context, pub amqp.Publishing) error {
	start := time.Now()
	ctx, cancel := context.WithDeadline(ctx, start.Add(j.b.cfg.PublishTimeout))
	defer cancel()
	j.seq++
	pub.Headers[headerJournalWriter] = j.writer
	pub.Headers[headerJournalSeq] = int64(j.seq)
	j.startedMu.Lock()
	j.started[j.seq%journalWriterSlots] = appendStart{seq: j.seq, at: start}
	j.startedMu.Unlock()
	if err := j.publish(ctx, pub); err != nil {
		j.lastOK = time.Time{}
		return err
	}
	j.lastOK = time.Now()
	return nil
}

// startedAt returns when this writer's append seq started, if it is remembered.
func (j *streamJournal) startedAt(seq uint64) (time.Time, bool) {
	j.startedMu.Lock()
	defer j.startedMu.Unlock()
	a := j.started[seq%journalWriterSlots]
	return a.at, a.seq == seq && !a.at.IsZero()
}

func (j *streamJournal) publish(ctx context.Context, pub amqp.Publishing) error {
	if err := j.ensure(ctx); err != nil {
		return err
	}
	err := j.b.pub.publishRaw(ctx, "", j.name, []amqp.Publishing{pub})
	if errors.Is(err, ErrUnroutable) {
		if _, derr := j.declare(ctx); derr != nil {
			return errors.Join(err, derr)
		}
		err = j.b.pub.publishRaw(ctx, "", j.name, []amqp.Publishing{pub})
	}
	if err != nil {
		return fmt.Errorf("append to journal %q: %w", j.name, err)
	}
	return nil
}

// Follow reads the stream from since (a timestamp offset: RabbitMQ starts at the chunk
// holding it, so a few older records may come first), then tails it. Knowing when it has
// caught up needs a position: Follow appends a marker of its own, and what precedes the
// marker was stored before Follow was called. After a lost consumer it resumes after the
// last offset it delivered, or from the start of a stream that had to be declared again.
func (j *streamJournal) Follow(ctx context.Context, since time.Time, deliver func([]byte), caughtUp func()) error {
	return j.follow(ctx, since, deliver, caughtUp, nil, false)
}

// FollowResyncing is Follow that also reports when the follower lost its place and when it
// found it again: behind runs when its consumer is lost after it had caught up (connection
// loss, broker restart, stream deleted), and caughtUp runs again once every record stored
// before it consumes again has been delivered (a marker of its own, appended after the
// loss, shows where that is). Resuming from the last offset delivers nothing twice and
// misses nothing, but the records stored meanwhile (another instance's, confirmed while
// this one reconnected) arrive only after the resumed consumer reads them, while the
// queue's consumer, reconnected as well, is taking the redeliveries of the same keys: the
// idempotency step uses behind and caughtUp to hold those until the follower is back.
func (j *streamJournal) FollowResyncing(ctx context.Context, since time.Time, deliver func([]byte), caughtUp, behind func()) error {
	return j.follow(ctx, since, deliver, caughtUp, behind, false)
}

// FollowOthers is FollowResyncing that delivers only the records other writers appended:
// not those appended through j itself, which its caller (the idempotency step) holds in
// memory already.
//
// Reading only what others wrote. Reading one's own records back is most of a follower's
// cost when an instance runs alone: each append is a stream chunk the broker reads and
// delivers again, on the connection the queue's deliveries share. On RabbitMQ 3.13 and
// later the follower stops reading records altogether while no other writer is active:
// records carry the stream filter value journalFilterRecord and markers
// journalFilterMarker, and the follower consumes with x-stream-filter journalFilterMarker
// (x-stream-match-unfiltered keeps what older sluice versions appended, which carries no
// value). A marker or record of another writer that it reads then makes it read
// everything again from there. What makes that safe is the marker rule: an append whose
// writer has had no append confirmed within journalHelloGap (H) is preceded by a marker,
// and every append is confirmed within PublishTimeout (T) of its start or counted failed.
// The follower reads markers only once it has read no other writer's append for
// Q = 2T + H + journalOwnFresh while reading everything, and has read back one of its own
// appends started within journalOwnFresh (so it is not lagging): any other writer's append
// confirmed after that point was then started more than H after that writer's previous
// confirm, or after a marker of its own past that point, which the follower reads. Right
// after a restore that read no other writer's append at all, it reads markers only at
// once: an active writer's previous append would have been in the restored span (the
// retention is far longer than H + T). On RabbitMQ before 3.13, which has no stream
// filters, it reads everything and skips its own records in the client.
func (j *streamJournal) FollowOthers(ctx context.Context, since time.Time, deliver func([]byte), caughtUp, behind func()) error {
	return j.follow(ctx, since, deliver, caughtUp, behind, true)
}

// appendMarker appends a Follow's position marker, trying again until ctx ends.
func (j *streamJournal) appendMarker(ctx context.Context, marker string) error {
	for {
		j.appendMu.Lock()
		err := j.appendLocked(ctx, markerPublishing(marker))
		j.appendMu.Unlock()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// A resource alarm, a node restarting: the restore waits, it does not fail.
		j.b.cfg.Logger.Warn("idempotency journal: cannot append its position marker; trying again", "stream", j.name, "error", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(journalRetry):
		}
	}
}

// errReadMarkersOnly and errReadEverything end a consume that switches how it reads;
// the follower consumes again from the next offset.
var (
	errReadMarkersOnly = errors.New("journal follower: no other writer active, reading markers only")
	errReadEverything  = errors.New("journal follower: another writer is active, reading everything")
)

// followState is a follower's position and what it knows, across its consumes.
type followState struct {
	deliver  func([]byte)
	caughtUp func()
	marker   atomic.Pointer[string] // the marker whose delivery means caught up
	last     int64                  // the last offset read, -1 before any
	caught   bool
	// others: deliver only other writers' records, and read markers only when allowed.
	others bool
	// markersOnly: the current consume reads markers only (x-stream-filter); filters: its
	// node filters streams (RabbitMQ 3.13 and later).
	markersOnly, filters bool
	// fromStart: the current consume reads from since or from a new stream's first
	// offset, not from where an earlier one stopped; foreign: it read another writer's
	// append (or an unmarked one an older sluice made).
	fromStart, foreign bool
	// lastForeign is when this consume, or the one before it, last read another writer's
	// append (its start when none); ownRead is the start of the newest own append it read
	// back (zero: none).
	lastForeign, ownRead time.Time
}

func (j *streamJournal) follow(ctx context.Context, since time.Time, deliver func([]byte), caughtUp, behind func(), others bool) error {
	st := &followState{deliver: deliver, caughtUp: caughtUp, last: -1, others: others}
	first := uuid.NewString()
	st.marker.Store(&first)
	if err := j.appendMarker(ctx, first); err != nil {
		return err
	}
	defer j.filtered.Store(false)

	// A resync's marker is appended beside the consumer, not before it: a stream that
	// refuses appends (replaced by a queue that nacks them, a full disk) must not stop the
	// follower from reading what it can. Handlers wait for it only for a bounded time.
	var (
		markerWG     sync.WaitGroup
		markerCancel = func() {}
	)
	defer func() {
		markerCancel()
		markerWG.Wait()
	}()
	resyncMarker := func() {
		markerCancel()
		markerWG.Wait()
		m := uuid.NewString()
		st.marker.Store(&m)
		mctx, cancel := context.WithCancel(ctx)
		markerCancel = cancel
		markerWG.Add(1)
		go func() {
			defer markerWG.Done()
			_ = j.appendMarker(mctx, m)
		}()
	}
	if others {
		var probeWG sync.WaitGroup
		defer probeWG.Wait() // after ctx ended: follow returns only then
		probeWG.Add(1)
		go func() {
			defer probeWG.Done()
			j.probe(ctx)
		}()
	}
	// A timestamp offset before the epoch (a zero since) makes RabbitMQ deliver nothing.
	var from any = since
	if since.Unix() <= 0 {
		from = "first"
	}
	var (
		next      = from // x-stream-offset of the next consume (a name, later an offset)
		firstPass = true
		switched  bool // the last consume ended to read otherwise: no pause, not a loss
		resync    bool // behind was called: a new marker is due
	)
	st.fromStart = true
	for {
		if !firstPass && !switched {
			j.resumed.Add(1)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(journalRetry):
			}
		}
		firstPass, switched = false, false
		created, err := j.declare(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			j.b.cfg.Logger.Warn("idempotency journal: cannot declare its stream; trying again", "stream", j.name, "error", err)
			continue
		}
		if created && st.last >= 0 {
			// A new stream numbers its offsets from 0 again.
			next, st.last = "first", -1
			st.fromStart, st.markersOnly = true, false
		}
		switch {
		case resync:
			// Whatever precedes the new marker (records confirmed while this follower
			// was away) is delivered before caughtUp.
			resyncMarker()
			resync, st.caught = false, false
		case created && !st.caught:
			// The marker went with the deleted stream: nothing before it can be read.
			st.caught = true
			caughtUp()
		}
		err = j.consume(ctx, next, st)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errReadMarkersOnly) || errors.Is(err, errReadEverything) {
			st.markersOnly = errors.Is(err, errReadMarkersOnly)
			st.fromStart, switched = false, true
			if st.markersOnly {
				j.switches.Add(1)
			}
			next = st.last + 1
			continue
		}
		cancelled := errors.Is(err, errJournalCancelled)
		if behind != nil && (st.caught || cancelled) {
			// Lost while caught up; or the stream deleted, which may have taken the
			// marker still ahead with it.
			behind()
			resync = true
		}
		if cancelled {
			// RabbitMQ cancels a stream's consumers when the stream is deleted; whoever
			// declares it again (this process or another instance), its offsets start
			// from 0, so read it from its start. Records read twice are harmless.
			next, st.last = "first", -1
			st.fromStart, st.markersOnly = true, false
			j.b.cfg.Logger.Warn("idempotency journal: RabbitMQ cancelled the stream consumer (stream deleted?); reading the stream again from its start",
				"stream", j.name, "error", err)
			continue
		}
		// Resumed where it stopped, reading as it did: markers only is as safe after a
		// reconnect as before it (every marker since is read).
		st.fromStart = false
		j.b.cfg.Logger.Warn("idempotency journal: lost its stream consumer; consuming again after the last record read",
			"stream", j.name, "last_offset", st.last, "error", err)
		if st.last >= 0 {
			next = st.last + 1
		}
	}
}

// probe appends a marker every journalProbeEvery while the follower reads markers only,
// until ctx ends.
func (j *streamJournal) probe(ctx context.Context) {
	t := time.NewTicker(journalProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !j.filtered.Load() {
			continue
		}
		j.appendMu.Lock()
		// A failure is the next tick's to make good.
		_ = j.appendLocked(ctx, markerPublishing(uuid.NewString()))
		j.appendMu.Unlock()
	}
}

// quietFor is Q of FollowOthers: how long a follower reading everything reads no other
// writer's append before it reads markers only.
func (j *streamJournal) quietFor() time.Duration {
	return 2*j.b.cfg.PublishTimeout + journalHelloGap + journalOwnFresh
}

// mayReadMarkersOnly reports whether st, reading everything, may read markers only now
// (FollowOthers): it has read no other writer's append for quietFor and has read back
// an own append started within journalOwnFresh.
func (j *streamJournal) mayReadMarkersOnly(st *followState) bool {
	if !st.others || !st.caught || st.markersOnly || time.Since(st.lastForeign) < j.quietFor() ||
		st.ownRead.IsZero() || time.Since(st.ownRead) > journalOwnFresh {
		return false
	}
	return st.filters
}

// restoredAlone reports whether st, reading everything, has caught up on a restore (or a
// new stream) that held no other writer's append, with a retention far longer than H+T:
// then it may read markers only at once (FollowOthers).
func (j *streamJournal) restoredAlone(st *followState) bool {
	return st.filters && st.others && st.caught && !st.markersOnly && st.fromStart && !st.foreign &&
		j.retention >= 2*j.quietFor()
}

// streamFilters reports whether conn's node filters streams (RabbitMQ 3.13 and later).
func streamFilters(conn *amqp.Connection) bool {
	return conn != nil && atLeast(nodeVersion(conn), [2]int{3, 13})
}

func (j *streamJournal) consume(ctx context.Context, from any, st *followState) error {
	ch, err := j.b.conn.channel(ctx)
	if err != nil {
		return err
	}
	if err := ch.Qos(journalPrefetch, 0, false); err != nil {
		_ = ch.Close()
		return fmt.Errorf("qos on journal %q: %w", j.name, err)
	}
	args := amqp.Table{"x-stream-offset": from}
	if st.markersOnly {
		args["x-stream-filter"] = journalFilterMarker
		args["x-stream-match-unfiltered"] = true
	}
	st.filters = streamFilters(j.b.conn.current())
	// Not ConsumeWithContext: its basic.cancel on ctx's end races the Close below.
	deliveries, err := ch.Consume(j.name, "", false, false, false, false, args)
	if err != nil {
		_ = ch.Close()
		return fmt.Errorf("consume journal %q: %w", j.name, err)
	}
	j.filtered.Store(st.markersOnly)
	defer func() {
		// amqp091 hands deliveries over unbuffered: until they are drained, its reader
		// cannot take the channel.close-ok, and Close would wait forever.
		go func() {
			for range deliveries {
			}
		}()
		closed := make(chan struct{})
		go func() {
			_ = ch.Close()
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(closeTimeout):
			// A node that stopped answering: the connection's loss ends the close.
		}
	}()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	cancelled := ch.NotifyCancel(make(chan string, 1))
	// A consume that reads everything counts its quiet time from its start.
	st.lastForeign = time.Now()
	var quiet <-chan time.Time
	if st.others && !st.markersOnly {
		t := time.NewTicker(journalQuietCheck)
		defer t.Stop()
		quiet = t.C
	}
	unacked := 0 // deliveries since the last ack
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e := <-closed:
			return fmt.Errorf("journal %q channel closed: %w", j.name, errorOrNil(e))
		case tag := <-cancelled:
			return fmt.Errorf("journal %q consumer %s: %w", j.name, tag, errJournalCancelled)
		case <-quiet:
			if j.mayReadMarkersOnly(st) {
				return errReadMarkersOnly
			}
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("journal %q: deliveries ended", j.name)
			}
			other := j.read(d, st)
			// A stream consumer's ack only grants credit, so one multiple ack a quarter of
			// the prefetch keeps deliveries coming. (It was meant to be so before, but the
			// test for an empty deliveries channel was always true: amqp091's is
			// unbuffered, so every stream message was acked.)
			if unacked++; unacked >= journalAckEvery {
				_ = d.Ack(true)
				unacked = 0
			}
			if other && st.markersOnly {
				// Another writer is active: read everything from here on.
				return errReadEverything
			}
			if j.restoredAlone(st) {
				return errReadMarkersOnly
			}
		}
	}
}

// read handles one stream delivery: a record is delivered (unless it is this writer's own
// and st.others), a marker is this follower's own (caught up) or another writer's; it
// reports whether the delivery came from another writer of this sluice version, which a
// follower reading markers only must read everything after.
func (j *streamJournal) read(d amqp.Delivery, st *followState) (other bool) {
	off, _ := d.Headers["x-stream-offset"].(int64)
	if off <= st.last {
		return false // read before the consumer was lost: applied already
	}
	st.last = off
	writer, marked := d.Headers[headerJournalWriter].(string)
	own := marked && writer == j.writer
	if own {
		if seq, ok := d.Headers[headerJournalSeq].(int64); ok && !st.markersOnly {
			if at, ok := j.startedAt(uint64(seq)); ok && at.After(st.ownRead) {
				st.ownRead = at
			}
		}
	} else {
		st.lastForeign, st.foreign = time.Now(), true
	}
	if m, isMarker := d.Headers[headerJournalMarker].(string); isMarker {
		if m == *st.marker.Load() && !st.caught {
			st.caught = true
			st.caughtUp()
		}
		return marked && !own
	}
	if own {
		j.ownRead.Add(1)
	}
	if !own || !st.others {
		st.deliver(d.Body)
	}
	return marked && !own
}
