package dlq

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice"
	sluiceamqp "github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/dlqwire"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
)

// replayer is the replay of one Selector back to each message's original queue, with the
// moved messages listed in its result: the API of the first sluice CLI, kept for its
// callers. Operator is the general form (archive, purge, To, progress).
type replayer struct {
	conn *amqp.Connection
	// Now is the clock ages are measured against. Nil means time.Now.
	Now func() time.Time
	// OnReplay, when set, is called for each message once its batch committed.
	OnReplay func(Moved)
	// Pace is Operator.Pace.
	Pace time.Duration

	skipDestinationCheck bool
}

// newReplayer returns a replayer on conn. The caller owns conn.
func newReplayer(conn *amqp.Connection) *replayer { return &replayer{conn: conn} }

// replayResult says what a replay did.
type replayResult struct {
	Queue  string `json:"queue"`
	DLQ    string `json:"dlq"`
	DryRun bool   `json:"dry_run"`
	// Scanned is how many DLQ messages were read.
	Scanned int `json:"scanned"`
	// Replayed are the messages moved, in DLQ order.
	Replayed []Moved `json:"replayed"`
	// Failed are selected messages left in the DLQ because their replay failed.
	Failed []Failure `json:"failed,omitempty"`
	// MissingIDs are ids of the Selector found nowhere in the DLQ.
	MissingIDs []string `json:"missing_ids,omitempty"`
	// IgnoredOrigins is Result.IgnoredOrigins.
	IgnoredOrigins int `json:"ignored_origins"`
}

// Replay is Operator.Replay with the moved messages listed. A selector that matches
// nothing is not an error here (the result is empty).
func (r *replayer) Replay(ctx context.Context, queue string, sel Selector) (replayResult, error) {
	return r.run(ctx, queue, sel, false)
}

// DryRun returns what Replay would move now, changing nothing.
func (r *replayer) DryRun(ctx context.Context, queue string, sel Selector) (replayResult, error) {
	return r.run(ctx, queue, sel, true)
}

func (r *replayer) run(ctx context.Context, queue string, sel Selector, dry bool) (replayResult, error) {
	res := replayResult{Queue: queue, DLQ: dlqName(queue), DryRun: dry, Replayed: []Moved{}}
	o := Operator{Conn: r.conn, Now: r.Now, Pace: r.Pace, skipDestinationCheck: r.skipDestinationCheck}
	o.OnMoved = func(m Moved) {
		res.Replayed = append(res.Replayed, m)
		if r.OnReplay != nil && !dry {
			r.OnReplay(m)
		}
	}
	out, err := o.Replay(ctx, queue, sel, Options{DryRun: dry})
	res.Scanned, res.Failed, res.MissingIDs, res.IgnoredOrigins = out.Scanned, out.Failed, out.MissingIDs, out.IgnoredOrigins
	if errors.Is(err, ErrNothingSelected) {
		err = nil
	}
	return res, err
}

func quoteAll(ids []string) string {
	q := make([]string, len(ids))
	for i, id := range ids {
		q[i] = strconv.Quote(id)
	}
	return strings.Join(q, ", ")
}

// resetHeader reports whether a replay removes header key: the retry and failure-record
// headers and the headers RabbitMQ owns (x-death, ...).
func resetHeader(key string) bool {
	return dlqwire.ResetOnReplay[key] || headers.BrokerOwned(key)
}

// replayEntryType is the type of the history entry a replay adds.
const replayEntryType = "replay"

// replayPublishing returns the publishing that replays d from source to dest at now,
// built by broker/amqp's Marshaler from the delivery as the stack would read it, so a
// replayed copy carries what any copy sluice publishes carries (no expiration or user-id,
// no CC/BCC or header RabbitMQ owns, typed headers restored, a header frame that fits
// frameMax): its body, properties and headers, less the ones resetHeader names, with
// x-replay-count set to replayCount (as a string, like sluice's other counters),
// x-replayed-at to now and a replay entry added to x-retry-history.
func replayPublishing(d amqp.Delivery, replayCount int, now time.Time, source, dest string, frameMax int) amqp.Publishing {
	msg, _ := sluiceamqp.Marshaler{}.Unmarshal(d)
	md := msg.Metadata
	for k := range md {
		if resetHeader(k) || strings.EqualFold(k, headers.ReplayCount) {
			delete(md, k)
		}
	}
	md.Set(headers.ReplayCount, strconv.Itoa(replayCount))
	md.Set(headers.ReplayedAt, failure.FormatTime(now))
	// The queue the copy is consumed from, whatever an older record said.
	md.Set(sluice.HeaderOriginalQueue, dest)
	prev, _ := d.Headers[sluice.HeaderRetryHistory].(string)
	md.Set(sluice.HeaderRetryHistory, failure.AppendHistory(message.Metadata{sluice.HeaderRetryHistory: prev}, failure.HistoryEntry{
		At: now.UTC(), Type: replayEntryType, Message: "replayed from " + source + " to " + dest,
	}))
	pub, _ := sluiceamqp.Marshaler{FrameMax: frameMax}.Marshal(msg) // never fails
	if d.Timestamp.IsZero() {
		pub.Timestamp = time.Time{} // Marshal stamps a message that had none; a replay keeps it as it was
	}
	return pub
}

// originalPublishing returns d as it was published to the DLQ, for putting it back. A
// producer's CC or BCC header is left out: RabbitMQ would route a copy by it.
func originalPublishing(d amqp.Delivery) amqp.Publishing {
	return amqp.Publishing{
		Headers:         withoutSenderRouting(d.Headers),
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

// withoutSenderRouting returns h without CC and BCC (see headers.SenderSelected); h itself
// when it has neither, so the usual message costs no copy.
func withoutSenderRouting(h amqp.Table) amqp.Table {
	_, cc := h["CC"]
	_, bcc := h["BCC"]
	if !cc && !bcc {
		return h
	}
	out := make(amqp.Table, len(h))
	for k, v := range h {
		if !headers.SenderSelected(k) {
			out[k] = v
		}
	}
	return out
}
