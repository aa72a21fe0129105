package dlq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice"
	sluiceamqp "github.com/sluice-go/sluice/broker/amqp"
)

// Selector chooses the messages a replay moves. Either All, or any of the filters, which
// must all match.
type Selector struct {
	// IDs selects messages by id (see Record.ID); every copy of an id is selected.
	IDs []string
	// ErrorType selects messages whose Record.ErrorType is exactly this.
	ErrorType string
	// OlderThan selects messages that failed at least this long ago; a message whose age
	// is unknown is not selected.
	OlderThan time.Duration
	// All selects every message.
	All bool
}

// Validate reports a Selector that selects nothing explicitly (ErrNoSelector), combines
// All with a filter, or has a negative age.
func (s Selector) Validate() error {
	filtered := len(s.IDs) > 0 || s.ErrorType != "" || s.OlderThan != 0
	switch {
	case s.OlderThan < 0:
		return fmt.Errorf("dlq: negative age %s", s.OlderThan)
	case s.All && filtered:
		return errors.New("dlq: All cannot be combined with ids, an error type or an age")
	case !s.All && !filtered:
		return ErrNoSelector
	}
	return nil
}

// Match reports whether r is selected.
func (s Selector) Match(r Record) bool {
	if s.All {
		return true
	}
	if len(s.IDs) > 0 && !slices.Contains(s.IDs, r.ID) {
		return false
	}
	if s.ErrorType != "" && r.ErrorType != s.ErrorType {
		return false
	}
	if s.OlderThan > 0 && (!r.HasAge || r.Age < s.OlderThan) {
		return false
	}
	return true
}

// Replayer moves messages from a DLQ back to their original queue (see the package doc
// for how a replay stays safe when the process is killed).
type Replayer struct {
	conn *amqp.Connection
	// Now is the clock ages are measured against. Nil means time.Now.
	Now func() time.Time
	// OnReplay, when set, is called after each committed replay (for progress output).
	OnReplay func(Replayed)
	// Pace is a test hook: each message's transaction waits this long between the publish
	// and the acknowledgement, so that a test can kill the process while a transaction is
	// open (and would see a duplicate if the two were not committed together).
	// Zero (the default) means no wait.
	Pace time.Duration

	// skipDestinationCheck is a test hook that lets a publish to a missing queue reach the
	// commit, to exercise the restore path.
	skipDestinationCheck bool
}

// NewReplayer returns a Replayer on conn. The caller owns conn.
func NewReplayer(conn *amqp.Connection) *Replayer { return &Replayer{conn: conn} }

// Replayed is one message a replay moved (or, in a dry run, would move).
type Replayed struct {
	ID          string `json:"id"`
	Destination string `json:"destination"`
	ErrorType   string `json:"error_type"`
	// ReplayCount is the x-replay-count the replayed copy carries.
	ReplayCount int `json:"replay_count"`
}

// Failure is a selected message that was not replayed; it is still in the DLQ.
type Failure struct {
	ID          string `json:"id"`
	Destination string `json:"destination"`
	Err         error  `json:"-"`
}

// ReplayResult says what a replay did.
type ReplayResult struct {
	Queue  string `json:"queue"`
	DLQ    string `json:"dlq"`
	DryRun bool   `json:"dry_run"`
	// Scanned is how many DLQ messages were read.
	Scanned int `json:"scanned"`
	// Replayed are the messages moved, in DLQ order.
	Replayed []Replayed `json:"replayed"`
	// Failed are selected messages left in the DLQ because their replay failed.
	Failed []Failure `json:"failed,omitempty"`
	// MissingIDs are ids of the Selector found nowhere in the DLQ.
	MissingIDs []string `json:"missing_ids,omitempty"`
}

// Replay moves the messages of queue's DLQ that sel selects back to their original queue,
// each in its own transaction. It returns what it did even with an error. The error
// matches ErrDestinationNotFound when a message's queue is missing (the message stays in
// the DLQ and the others are still replayed), ErrMessageNotFound when an id of sel was not
// found, ErrQueueNotFound when the DLQ does not exist.
func (r *Replayer) Replay(ctx context.Context, queue string, sel Selector) (ReplayResult, error) {
	return r.run(ctx, queue, sel, false)
}

// DryRun returns what Replay would move now, changing nothing.
func (r *Replayer) DryRun(ctx context.Context, queue string, sel Selector) (ReplayResult, error) {
	return r.run(ctx, queue, sel, true)
}

func (r *Replayer) run(ctx context.Context, queue string, sel Selector, dry bool) (ReplayResult, error) {
	res := ReplayResult{Queue: queue, DLQ: DLQName(queue), DryRun: dry, Replayed: []Replayed{}}
	if err := sel.Validate(); err != nil {
		return res, err
	}
	ch, total, err := openDLQ(r.conn, queue)
	if err != nil {
		return res, err
	}
	defer ch.Close() // gives back, in order, every message not replayed
	m := mover{r: r, ch: ch, dlq: res.DLQ}
	defer m.closeProbe()
	if !dry {
		if err := ch.Tx(); err != nil {
			return res, fmt.Errorf("start transaction on %q: %w", res.DLQ, err)
		}
		// Buffered: the channel's reader delivers a return before the commit-ok, and must
		// not block on us.
		m.returns = ch.NotifyReturn(make(chan amqp.Return, 4))
	}
	found := map[string]bool{}
	finish := func(err error) (ReplayResult, error) {
		if err != nil {
			return res, err
		}
		for _, id := range sel.IDs {
			if !found[id] && !slices.Contains(res.MissingIDs, id) {
				res.MissingIDs = append(res.MissingIDs, id)
			}
		}
		if len(res.Failed) > 0 {
			return res, fmt.Errorf("%d of %d selected messages not replayed, still in %q; first: %w",
				len(res.Failed), len(res.Failed)+len(res.Replayed), res.DLQ, res.Failed[0].Err)
		}
		if len(res.MissingIDs) > 0 {
			return res, fmt.Errorf("ids %s in %q: %w", quoteAll(res.MissingIDs), res.DLQ, ErrMessageNotFound)
		}
		return res, nil
	}
	// Only the messages present at the start: a replayed message that fails again lands
	// at the DLQ's tail and must not be replayed again by this run.
	for res.Scanned < total {
		if err := ctx.Err(); err != nil {
			return finish(fmt.Errorf("replay from %q interrupted after %d of %d messages: %w", res.DLQ, res.Scanned, total, err))
		}
		d, ok, err := ch.Get(res.DLQ, false)
		if err != nil {
			return finish(fmt.Errorf("read %q: %w", res.DLQ, err))
		}
		if !ok {
			break
		}
		res.Scanned++
		rec := NewRecord(d, queue, res.Scanned, now(r.Now))
		if !sel.Match(rec) {
			continue // stays unacknowledged until the channel closes
		}
		found[rec.ID] = true
		done := Replayed{ID: rec.ID, Destination: rec.OriginalQueue, ErrorType: rec.ErrorType, ReplayCount: rec.Replays + 1}
		if dry {
			res.Replayed = append(res.Replayed, done)
			continue
		}
		if err := m.move(d, rec); err != nil {
			if errors.Is(err, ErrDestinationNotFound) {
				res.Failed = append(res.Failed, Failure{ID: rec.ID, Destination: rec.OriginalQueue, Err: err})
				continue
			}
			return finish(err)
		}
		res.Replayed = append(res.Replayed, done)
		if r.OnReplay != nil {
			r.OnReplay(done)
		}
	}
	return finish(nil)
}

func quoteAll(ids []string) string {
	q := make([]string, len(ids))
	for i, id := range ids {
		q[i] = strconv.Quote(id)
	}
	return strings.Join(q, ", ")
}

// mover moves one message at a time inside a transaction on ch.
type mover struct {
	r       *Replayer
	ch      *amqp.Channel
	dlq     string
	returns <-chan amqp.Return
	probe   *amqp.Channel // for passive declares, which close their channel on 404
}

// move replays d in one transaction. Its error matches ErrDestinationNotFound when the
// destination is missing and the DLQ copy is kept; any other error means the channel or
// the message is in trouble and the run must stop.
func (m *mover) move(d amqp.Delivery, rec Record) error {
	dest := rec.OriginalQueue
	if !m.r.skipDestinationCheck {
		if err := m.checkDestination(dest); err != nil {
			return fmt.Errorf("message %q: %w", rec.ID, err)
		}
	}
	pub := ReplayPublishing(d, rec.Replays+1)
	if err := m.ch.Publish("", dest, true, false, pub); err != nil {
		return fmt.Errorf("publish message %q to %q: %w", rec.ID, dest, err)
	}
	if m.r.Pace > 0 {
		time.Sleep(m.r.Pace)
	}
	if err := m.ch.Ack(d.DeliveryTag, false); err != nil {
		return fmt.Errorf("acknowledge message %q in %q: %w", rec.ID, m.dlq, err)
	}
	if err := m.ch.TxCommit(); err != nil {
		return fmt.Errorf("commit replay of message %q to %q: %w", rec.ID, dest, err)
	}
	// RabbitMQ sends a transaction's returns during tx.commit, before commit-ok, and the
	// client has queued them by the time TxCommit returned.
	select {
	case ret := <-m.returns:
		return m.restore(d, rec, ret)
	default:
		return nil
	}
}

// restore puts the DLQ copy of d back into the DLQ after its replay was returned as
// unroutable at commit, when the DLQ copy's acknowledgement was committed too. Its error
// matches ErrDestinationNotFound only when the copy is back in the DLQ; otherwise the
// error carries the payload, the only copy left, and the run stops.
func (m *mover) restore(d amqp.Delivery, rec Record, ret amqp.Return) error {
	returned := fmt.Errorf("message %q: publish to %q returned by RabbitMQ (%d %s): %w",
		rec.ID, rec.OriginalQueue, ret.ReplyCode, ret.ReplyText, ErrDestinationNotFound)
	if err := m.ch.Publish("", m.dlq, true, false, originalPublishing(d)); err != nil {
		return fmt.Errorf("%v; putting it back into %q failed (payload %q): %w", returned, m.dlq, d.Body, err)
	}
	if err := m.ch.TxCommit(); err != nil {
		return fmt.Errorf("%v; putting it back into %q failed (payload %q): %w", returned, m.dlq, d.Body, err)
	}
	select {
	case <-m.returns:
		return fmt.Errorf("%v; putting it back into %q was returned too (payload %q)", returned, m.dlq, d.Body)
	default:
	}
	return fmt.Errorf("%w; it was put back at the tail of %q", returned, m.dlq)
}

// checkDestination returns ErrDestinationNotFound when queue does not exist.
func (m *mover) checkDestination(queue string) error {
	if m.probe == nil {
		ch, err := m.r.conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		m.probe = ch
	}
	if _, err := m.probe.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		m.probe = nil // a failed passive declare closes the channel
		if isNotFound(err) {
			return fmt.Errorf("queue %q: %w", queue, ErrDestinationNotFound)
		}
		return fmt.Errorf("check queue %q: %w", queue, err)
	}
	return nil
}

func (m *mover) closeProbe() {
	if m.probe != nil {
		_ = m.probe.Close()
	}
}

// resetOnReplay are the headers a replay removes: the retry state and the failure record,
// so the message starts over with a full set of retries. x-original-queue stays (it names
// the queue the message goes back to).
var resetOnReplay = map[string]bool{
	sluice.HeaderRetryCount:       true,
	sluice.HeaderFirstFailureTime: true,
	sluice.HeaderLastFailureTime:  true,
	sluice.HeaderLastError:        true,
	sluice.HeaderLastErrorMessage: true,
	sluice.HeaderRetryHistory:     true,
	sluice.HeaderDeferCount:       true,
	sluice.HeaderFirstDeferTime:   true,
	sluice.HeaderErrorType:        true,
	sluice.HeaderErrorMessage:     true,
	sluice.HeaderErrorStack:       true,
	sluice.HeaderErrorClass:       true,
	sluice.HeaderHandler:          true,
	sluice.HeaderFailedAt:         true,
	sluice.HeaderFailedHost:       true,
	sluice.HeaderFailedPID:        true,
}

// ResetHeader reports whether a replay removes header key: the retry and failure-record
// headers and the headers RabbitMQ owns (x-death, ...).
func ResetHeader(key string) bool {
	return resetOnReplay[key] || sluiceamqp.BrokerOwnedHeader(key)
}

// ReplayPublishing returns the publishing that replays d: its body, properties and headers,
// less the ones ResetHeader names, with x-replay-count set to replayCount (as a string,
// like sluice's other counters). Expiration and user-id are not carried, as in
// broker/amqp.Marshaler.
func ReplayPublishing(d amqp.Delivery, replayCount int) amqp.Publishing {
	headers := make(amqp.Table, len(d.Headers)+1)
	for k, v := range d.Headers {
		if !ResetHeader(k) && !strings.EqualFold(k, sluice.HeaderReplayCount) {
			headers[k] = v
		}
	}
	headers[sluice.HeaderReplayCount] = strconv.Itoa(replayCount)
	pub := originalPublishing(d)
	pub.Headers = headers
	return pub
}

// originalPublishing returns d as it was published to the DLQ, for putting it back.
func originalPublishing(d amqp.Delivery) amqp.Publishing {
	return amqp.Publishing{
		Headers:         d.Headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}
