package amqp

import (
	"context"
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
func (b *Broker) Journal(name string, retention time.Duration) broker.Journal {
	return &streamJournal{b: b, name: name, retention: retention}
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

	recreated atomic.Int64
	resumed   atomic.Int64
}

// JournalsRecreated counts the journal streams (of every Journal of b) found deleted under
// a running journal and declared again.
func (b *Broker) JournalsRecreated() int64 { return b.journalsRecreated.Load() }

// journalStats counts what a journal had to repair.
type journalStats struct {
	// Recreated counts the times the stream was found deleted and declared again.
	Recreated int64
	// Resumed counts the times Follow consumed again after losing its consumer
	// (connection loss, broker restart, stream deleted).
	Resumed int64
}

// journalStatsOf returns what j had to repair, and false when j did not come from
// Broker.Journal.
func journalStatsOf(j broker.Journal) (journalStats, bool) {
	sj, ok := j.(*streamJournal)
	if !ok {
		return journalStats{}, false
	}
	return journalStats{Recreated: sj.recreated.Load(), Resumed: sj.resumed.Load()}, true
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
	return j.publish(ctx, amqp.Publishing{
		ContentType:  journalContentType,
		DeliveryMode: amqp.Persistent,
		Timestamp:    time.Now(),
		Body:         body,
	})
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
	return j.follow(ctx, since, deliver, caughtUp, nil)
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
	return j.follow(ctx, since, deliver, caughtUp, behind)
}

// appendMarker appends a Follow's position marker, trying again until ctx ends.
func (j *streamJournal) appendMarker(ctx context.Context, marker string) error {
	for {
		err := j.publish(ctx, amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			Headers:      amqp.Table{headerJournalMarker: marker},
		})
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

func (j *streamJournal) follow(ctx context.Context, since time.Time, deliver func([]byte), caughtUp, behind func()) error {
	var marker atomic.Pointer[string] // the marker whose delivery means caught up
	first := uuid.NewString()
	marker.Store(&first)
	if err := j.appendMarker(ctx, first); err != nil {
		return err
	}
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
		marker.Store(&m)
		mctx, cancel := context.WithCancel(ctx)
		markerCancel = cancel
		markerWG.Add(1)
		go func() {
			defer markerWG.Done()
			_ = j.appendMarker(mctx, m)
		}()
	}
	// A timestamp offset before the epoch (a zero since) makes RabbitMQ deliver nothing.
	var from any = since
	if since.Unix() <= 0 {
		from = "first"
	}
	var (
		next            = from // x-stream-offset of the next consume (a name, later an offset)
		last      int64 = -1
		caught    bool
		firstPass = true
		resync    bool // behind was called: a new marker is due
	)
	for {
		if !firstPass {
			j.resumed.Add(1)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(journalRetry):
			}
		}
		firstPass = false
		created, err := j.declare(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			j.b.cfg.Logger.Warn("idempotency journal: cannot declare its stream; trying again", "stream", j.name, "error", err)
			continue
		}
		if created && last >= 0 {
			// A new stream numbers its offsets from 0 again.
			next, last = "first", -1
		}
		switch {
		case resync:
			// Whatever precedes the new marker (records confirmed while this follower
			// was away) is delivered before caughtUp.
			resyncMarker()
			resync, caught = false, false
		case created && !caught:
			// The marker went with the deleted stream: nothing before it can be read.
			caught = true
			caughtUp()
		}
		err = j.consume(ctx, next, &last, &marker, &caught, deliver, caughtUp)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		cancelled := errors.Is(err, errJournalCancelled)
		if behind != nil && (caught || cancelled) {
			// Lost while caught up; or the stream deleted, which may have taken the
			// marker still ahead with it.
			behind()
			resync = true
		}
		if cancelled {
			// RabbitMQ cancels a stream's consumers when the stream is deleted; whoever
			// declares it again (this process or another instance), its offsets start
			// from 0, so read it from its start. Records read twice are harmless.
			next, last = "first", -1
			j.b.cfg.Logger.Warn("idempotency journal: RabbitMQ cancelled the stream consumer (stream deleted?); reading the stream again from its start",
				"stream", j.name, "error", err)
			continue
		}
		j.b.cfg.Logger.Warn("idempotency journal: lost its stream consumer; consuming again after the last record read",
			"stream", j.name, "last_offset", last, "error", err)
		if last >= 0 {
			next = last + 1
		}
	}
}

func (j *streamJournal) consume(ctx context.Context, from any, last *int64, marker *atomic.Pointer[string], caught *bool, deliver func([]byte), caughtUp func()) error {
	ch, err := j.b.conn.channel(ctx)
	if err != nil {
		return err
	}
	if err := ch.Qos(journalPrefetch, 0, false); err != nil {
		_ = ch.Close()
		return fmt.Errorf("qos on journal %q: %w", j.name, err)
	}
	// Not ConsumeWithContext: its basic.cancel on ctx's end races the Close below.
	deliveries, err := ch.Consume(j.name, "", false, false, false, false, amqp.Table{"x-stream-offset": from})
	if err != nil {
		_ = ch.Close()
		return fmt.Errorf("consume journal %q: %w", j.name, err)
	}
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
	unacked := 0 // deliveries since the last ack
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e := <-closed:
			return fmt.Errorf("journal %q channel closed: %w", j.name, errorOrNil(e))
		case tag := <-cancelled:
			return fmt.Errorf("journal %q consumer %s: %w", j.name, tag, errJournalCancelled)
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("journal %q: deliveries ended", j.name)
			}
			off, _ := d.Headers["x-stream-offset"].(int64)
			switch m, isMarker := d.Headers[headerJournalMarker].(string); {
			case off <= *last:
				// Read before the consumer was lost: applied already.
			case isMarker:
				*last = off
				if m == *marker.Load() && !*caught {
					*caught = true
					caughtUp()
				}
			default:
				*last = off
				deliver(d.Body)
			}
			// A stream consumer's ack only grants credit, so one multiple ack a quarter of
			// the prefetch keeps deliveries coming. (It was meant to be so before, but the
			// test for an empty deliveries channel was always true: amqp091's is
			// unbuffered, so every stream message was acked.)
			if unacked++; unacked >= journalAckEvery {
				_ = d.Ack(true)
				unacked = 0
			}
		}
	}
}
