package dlq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrNothingSelected means the selector of an operation matched no message: nothing was
// changed.
var ErrNothingSelected = errors.New("no message matches the selector")

// ErrCompensated means a replay or an edit was refused for a dead letter whose
// compensation event was published (Record.CompensationID): the work the message was part
// of was undone elsewhere (an order cancelled when its payment gave up), and processing it
// again redoes that work. Options.Compensated confirms it. A refused message stays in the
// source, in its place, named in Result.Failed; the others of the selection move.
var ErrCompensated = errors.New("dlq: the dead letter's compensation was published")

// defaultBatchSize is how many messages an Operator moves in one transaction.
const defaultBatchSize = 500

// Operator replays, archives and purges dead letters in bulk, in batches, each batch one
// AMQP transaction (see the package doc: a process killed at any point neither loses nor
// duplicates a message). The console and the CLI share it. It is a plain value:
// dlq.Operator{Conn: conn} acts as the OS user, with batches of 500.
type Operator struct {
	// Conn is the RabbitMQ connection operations open their channels on. Required; the
	// caller owns it.
	Conn *amqp.Connection
	// Now is the clock ages are measured against. Nil means time.Now.
	Now func() time.Time
	// BatchSize is how many messages one transaction moves. Zero means 500.
	BatchSize int
	// Window is how many messages a run has in flight from RabbitMQ. Zero means
	// 2,000; it is raised to twice BatchSize when lower.
	Window int
	// Progress, when set, is called as the operation goes (see Progress).
	Progress func(Progress)
	// OnMoved, when set, is called for each message once its batch committed (in a dry
	// run: for each message that would move), in queue order.
	OnMoved func(Moved)
	// Actor names who acts in the audit trail (see AuditEvent.Actor): the console sets
	// "console:<token name>". Empty means the OS user and host name ("alice@host").
	Actor string
	// AuditExchange is the durable fanout exchange every action is recorded on, bound to
	// a durable queue of the same name (see AuditEvent). Empty means "sluice.audit".
	AuditExchange string
	// Pace is a test hook: each batch's transaction waits this long after its publishes
	// and acknowledgements, before the commit, so that a test can kill the process while
	// a transaction is open. Zero (the default) means no wait.
	Pace time.Duration

	// skipDestinationCheck is a test hook that lets a publish to a missing queue reach the
	// commit, to exercise the restore path.
	skipDestinationCheck bool
}

// Options are the settings of one operation. The zero value reads Q.dlq, sends replays to
// each message's original queue and creates the archive with a retention of 14 days.
type Options struct {
	// From is the queue the messages are taken from: Q.dlq or Q.dlq.archive.
	From Source
	// To, for Replay, sends every message to this queue instead of its original queue
	// (x-original-queue when it names Q or one of Q's partitions, else Q), for example a
	// fixed handler's new queue. The queue must exist.
	To string
	// Retention, for Archive, is the archive's x-message-ttl when Archive creates it.
	// Zero means 14 days (internal/dlqwire.DefaultRetention).
	Retention time.Duration
	// ArchiveType, for Archive, is the archive's queue type when Archive creates it
	// ("classic" or "quorum"). Empty means classic.
	ArchiveType string
	// DryRun reads and selects but changes nothing.
	DryRun bool
	// Compensated, for Replay and Edit, confirms processing again dead letters whose
	// compensation event was published (Record.CompensationID): the operator knows the
	// work they were part of was undone, and wants it redone. The audit trail records the
	// confirmation (AuditEvent.ConfirmedCompensated). False refuses them with
	// ErrCompensated.
	Compensated bool
}

// Moved is one message an operation moved or deleted (or, in a dry run, would have).
type Moved struct {
	ID string `json:"id"`
	// Destination is the queue it went to; empty for a purge.
	Destination string `json:"destination,omitempty"`
	ErrorType   string `json:"error_type"`
	GroupID     string `json:"group_id"`
	// ReplayCount is the x-replay-count a replayed copy carries.
	ReplayCount int `json:"replay_count,omitempty"`
	// IgnoredOrigin is true when the message's recorded origin (x-original-queue, or
	// RabbitMQ's x-first-death-queue) was neither Q nor one of Q's partitions, and the
	// replay sent it to Q instead.
	IgnoredOrigin bool `json:"ignored_origin,omitempty"`
	// CompensationID, for a replay or an edit, is the id of the compensation event that
	// was published beside the dead letter (Record.CompensationID); empty when none was.
	CompensationID string `json:"compensation_id,omitempty"`
}

// Result says what an operation did. Every count is exact also when an error is returned.
type Result struct {
	// Op is "replay", "archive" or "purge".
	Op string `json:"op"`
	// Queue is Q; Source the queue read (Q.dlq or Q.dlq.archive).
	Queue  string `json:"queue"`
	Source string `json:"source"`
	// Destination is where every message went when it is one queue (archive, replay
	// with To); empty when each went to its own original queue, or for a purge.
	Destination string `json:"destination,omitempty"`
	DryRun      bool   `json:"dry_run"`
	// Total is the number of messages the source held when the operation started.
	Total int `json:"total"`
	// Scanned is how many were read, Matched how many the selector chose, Moved how many
	// were moved or deleted (committed; in a dry run, would be).
	Scanned int `json:"scanned"`
	Matched int `json:"matched"`
	Moved   int `json:"moved"`
	// IDs are the ids of the first 100 messages moved, in queue order (none for a purge
	// of a whole queue, which RabbitMQ does in one queue.purge).
	IDs []string `json:"ids,omitempty"`
	// MovedByID, when the selector names ids, counts the messages moved of each: more
	// than 1 when several messages of the source share the id, and all of them moved.
	MovedByID map[string]int `json:"moved_by_id,omitempty"`
	// Failed are selected messages left in the source because their move failed, or was
	// refused (a compensated dead letter without Options.Compensated: ErrCompensated).
	Failed []Failure `json:"-"`
	// Compensated, for Replay and Edit, counts the moved messages whose compensation event
	// had been published (Record.CompensationID), which Options.Compensated confirmed.
	Compensated int `json:"compensated,omitempty"`
	// MissingIDs are ids of the Selector found nowhere in the source.
	MissingIDs []string `json:"missing_ids,omitempty"`
	// IgnoredOrigins, for Replay, counts the selected messages whose recorded origin was
	// neither Q nor one of its partitions: they went to Q (or To), never to the queue
	// their header named.
	IgnoredOrigins int `json:"ignored_origins"`
	// Elapsed is how long the operation took.
	Elapsed time.Duration `json:"-"`
}

// Failure is a selected message that was not moved; it is still in the source queue.
type Failure struct {
	ID          string `json:"id"`
	Destination string `json:"destination"`
	Err         error  `json:"-"`
}

// Every operation but a dry run is an action the audit trail records (see AuditEvent): when
// its "started" record cannot be written, it does not run and its error matches
// ErrAuditUnavailable.

// Replay sends the messages of queue's DLQ (or archive) that sel selects to their original
// queue, or to opts.To, with their retry state reset (see the package doc). Errors match
// ErrNothingSelected, ErrMessageNotFound (an id of sel is missing), sluice.ErrQueueNotFound (no
// such DLQ), ErrDestinationNotFound (a destination queue is missing: those messages
// stay, the others move) or ErrCompensated (a selected dead letter's compensation was
// published and opts.Compensated does not confirm replaying it: it stays, the others move).
func (o Operator) Replay(ctx context.Context, queue string, sel Selector, opts Options) (Result, error) {
	return o.act(ctx, opReplay, queue, sel, opts, func() (Result, error) {
		return o.run(ctx, opReplay, queue, sel, opts)
	})
}

// Archive moves the messages of queue's DLQ that sel selects, unchanged, to
// Q.dlq.archive, creating it with opts.Retention when it does not exist. Archived messages
// can be read (Inspector.From) and replayed or purged (Options.From) like dead letters.
func (o Operator) Archive(ctx context.Context, queue string, sel Selector, opts Options) (Result, error) {
	if opts.From == FromArchive {
		return Result{Op: opArchive, Queue: queue}, errors.New("dlq: archived messages are archived already")
	}
	return o.act(ctx, opArchive, queue, sel, opts, func() (Result, error) {
		return o.run(ctx, opArchive, queue, sel, opts)
	})
}

// Purge deletes the messages of queue's DLQ (or archive) that sel selects. With sel.All
// it empties the queue in one queue.purge; messages another client holds unacknowledged
// at that moment are not ready and survive.
func (o Operator) Purge(ctx context.Context, queue string, sel Selector, opts Options) (Result, error) {
	return o.act(ctx, opPurge, queue, sel, opts, func() (Result, error) {
		if sel.All && !opts.DryRun {
			return o.purgeAll(ctx, queue, opts.From)
		}
		return o.run(ctx, opPurge, queue, sel, opts)
	})
}

// act runs fn, the operation op on queue, audited, once sel is valid: a selector that
// selects nothing is refused before anything is recorded.
func (o Operator) act(ctx context.Context, op, queue string, sel Selector, opts Options, fn func() (Result, error)) (Result, error) {
	if err := sel.validate(); err != nil {
		return Result{Op: op, Queue: queue, Source: opts.From.name(queue), DryRun: opts.DryRun}, err
	}
	return o.audited(ctx, op, queue, opts.From.name(queue), sel.String(), opts, fn)
}

const (
	opReplay  = "replay"
	opArchive = "archive"
	opPurge   = "purge"
	opEdit    = "edit"
)

func (o Operator) purgeAll(ctx context.Context, queue string, src Source) (Result, error) {
	start := time.Now()
	res := Result{Op: opPurge, Queue: queue, Source: src.name(queue)}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	ch, total, err := openSource(o.Conn, queue, src)
	if err != nil {
		return res, err
	}
	defer ch.Close()
	res.Total = total
	n, err := ch.QueuePurge(res.Source, false)
	if err != nil {
		return res, fmt.Errorf("purge %q: %w", res.Source, err)
	}
	res.Scanned, res.Matched, res.Moved, res.Elapsed = n, n, n, time.Since(start)
	if n == 0 {
		return res, fmt.Errorf("%q is empty: %w", res.Source, ErrNothingSelected)
	}
	return res, nil
}

func (o Operator) run(ctx context.Context, op, queue string, sel Selector, opts Options) (Result, error) {
	return o.runWith(ctx, op, queue, sel, opts, nil)
}

// runWith is run with the mover adjusted by configure (an edit's).
func (o Operator) runWith(ctx context.Context, op, queue string, sel Selector, opts Options, configure func(*mover)) (Result, error) {
	start := time.Now()
	res := Result{Op: op, Queue: queue, Source: opts.From.name(queue), DryRun: opts.DryRun}
	if err := sel.validate(); err != nil {
		return res, err
	}
	ch, total, err := openSource(o.Conn, queue, opts.From)
	if err != nil {
		return res, err
	}
	owned := true // until the reader owns ch
	defer func() {
		if owned {
			_ = ch.Close()
		}
	}()
	res.Total = total
	m := &mover{o: &o, op: op, queue: queue, source: res.Source, to: opts.To, now: now(o.Now), returns: map[*amqp.Channel]<-chan amqp.Return{},
		byID: len(sel.IDs) > 0}
	defer m.closeProbe()
	if configure != nil {
		configure(m)
	}
	switch {
	case op == opArchive:
		m.to = archiveName(queue)
		if !opts.DryRun {
			if err := m.ensureArchive(m.to, opts); err != nil {
				return res, err
			}
		}
	case op == opEdit:
		m.archive = archiveName(queue)
		if err := m.ensureArchive(m.archive, opts); err != nil {
			return res, err
		}
	case op == opReplay && opts.To != "":
		if err := m.checkDestination(opts.To); err != nil {
			return res, err
		}
	}
	res.Destination = m.to
	batchSize := o.BatchSize
	if batchSize <= 0 {
		batchSize = defaultBatchSize
	}
	window := max(o.Window, 2*batchSize)
	if o.Window == 0 {
		window = max(defaultWindow, 2*batchSize)
	}
	setup := func(c *amqp.Channel) error {
		if opts.DryRun {
			return nil
		}
		if err := c.Tx(); err != nil {
			return fmt.Errorf("start transaction on %q: %w", res.Source, err)
		}
		// Buffered beyond a batch: the channel's reader delivers a transaction's returns
		// before its commit-ok, and must not block on us.
		m.returns[c] = c.NotifyReturn(make(chan amqp.Return, 2*batchSize+8))
		return nil
	}
	// A run keeps no message unacknowledged (the ones it skips are published back, see the
	// package doc), so its one consumer never needs replacing; a dry run holds every
	// message like a read, and like a read replaces its consumer only once the window is
	// full, with no delivery in flight.
	reserve := batchSize
	if opts.DryRun {
		reserve = 0
	}
	rd, err := newReader(o.Conn, ch, res.Source, total, window, reserve, setup)
	if err != nil {
		return res, err
	}
	owned = false
	defer rd.close() // gives back, in order, every message read and not moved
	m.rd = rd
	prog := newProgressor(o.Progress, op, res.Source, total)

	found := map[string]bool{}
	moving := 0 // selected messages to move (not refused)
	batch := make([]item, 0, batchSize)
	finish := func(err error) (Result, error) {
		if err == nil {
			err = m.commit(batch, &res, prog)
		}
		prog.done()
		res.Elapsed = time.Since(start)
		if err != nil {
			return res, err
		}
		return res, o.outcome(&res, sel, found)
	}
	// Only the messages present at the start: a replayed message that fails again lands
	// at the DLQ's tail and must not be replayed again by this run.
	for {
		d, dch, ok, err := rd.next(ctx)
		if err != nil {
			return finish(fmt.Errorf("%s from %q interrupted after %d of %d messages: %w", op, res.Source, res.Scanned, total, err))
		}
		if !ok {
			break
		}
		res.Scanned++
		rec := selectionRecord(d, queue, res.Scanned, m.now)
		var it item
		// An edit takes the first message with its id; later copies stay.
		selected := sel.match(rec) && (op != opEdit || res.Matched == 0)
		refused := false
		if selected {
			res.Matched++
			prog.scanned(1, true)
			if len(sel.IDs) > 0 {
				found[rec.ID] = true
			}
			it = item{d: d, ch: dch, moved: m.moved(rec)}
			if err := m.refuseCompensated(rec, opts); err != nil {
				if op == opEdit {
					return finish(err)
				}
				// Left where it is, like a message the selector skipped: a run whose every
				// selected message is refused writes nothing.
				res.Failed = append(res.Failed, Failure{ID: rec.ID, Destination: it.moved.Destination, Err: err})
				refused = true
			}
			if m.edit != nil {
				if err := m.edit.check(d); err != nil {
					return finish(err)
				}
			}
			if it.moved.IgnoredOrigin && !refused {
				res.IgnoredOrigins++
			}
		}
		if selected && !refused {
			moving++
		} else {
			if !selected {
				prog.scanned(1, false)
			}
			// Until the first match, a skipped message is held and goes back in place when
			// the run ends, so a run that matches nothing writes nothing; from the first
			// match on (or once holding more would need a second consumer), skipped
			// messages are published back to the tail, behind the held ones: the source
			// keeps its order either way.
			if opts.DryRun || (moving == 0 && rd.canHold()) {
				rd.hold(d)
				continue
			}
			it = m.kept(item{d: d, ch: dch, moved: Moved{ID: rec.ID}})
		}
		if opts.DryRun {
			rd.hold(d)
			m.count(&res, it.moved)
			if o.OnMoved != nil {
				o.OnMoved(it.moved)
			}
			continue
		}
		if len(batch) > 0 && batch[0].ch != it.ch {
			// A batch is one transaction, on one channel.
			if err := m.commit(batch, &res, prog); err != nil {
				return finish(err)
			}
			batch = batch[:0]
		}
		batch = append(batch, it)
		if len(batch) == batchSize {
			if err := m.commit(batch, &res, prog); err != nil {
				return finish(err)
			}
			batch = batch[:0]
		}
	}
	return finish(nil)
}

// outcome is the error a finished run returns: failed moves first, then ids not found,
// then a selector that matched nothing.
func (o Operator) outcome(res *Result, sel Selector, found map[string]bool) error {
	for _, id := range sel.IDs {
		if !found[id] && !slices.Contains(res.MissingIDs, id) {
			res.MissingIDs = append(res.MissingIDs, id)
		}
	}
	refused := 0
	for _, f := range res.Failed {
		if errors.Is(f.Err, ErrCompensated) {
			refused++
		}
	}
	switch {
	case refused > 0:
		// First, whatever else failed: the operator's decision is what is asked for.
		i := slices.IndexFunc(res.Failed, func(f Failure) bool { return errors.Is(f.Err, ErrCompensated) })
		err := fmt.Errorf("%d of %d selected messages not moved, still in %q: %d refused because their compensation was published and replaying them was not confirmed; first: %w",
			len(res.Failed), res.Matched, res.Source, refused, res.Failed[i].Err)
		if i > 0 {
			err = fmt.Errorf("%w; and: %w", err, res.Failed[0].Err)
		}
		return err
	case len(res.Failed) > 0:
		return fmt.Errorf("%d of %d selected messages not moved, still in %q; first: %w",
			len(res.Failed), res.Matched, res.Source, res.Failed[0].Err)
	case len(res.MissingIDs) > 0:
		return fmt.Errorf("ids %s in %q: %w", quoteAll(res.MissingIDs), res.Source, ErrMessageNotFound)
	case res.Matched == 0:
		return fmt.Errorf("%s: none of the %d messages in %q matches %s: %w", res.Op, res.Scanned, res.Source, sel, ErrNothingSelected)
	}
	return nil
}
