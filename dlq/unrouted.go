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
	"github.com/sluice-go/sluice/internal/dlqview"
	"github.com/sluice-go/sluice/internal/dlqwire"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/mask"
	"github.com/sluice-go/sluice/internal/topology"
)

// Events nobody was bound for. Every exchange sluice declares has the alternate exchange
// sluice.unrouted, whose queue keeps what the exchange could route nowhere, with the
// exchange and routing key it was published with (RabbitMQ keeps both on a message an
// alternate exchange routes). ListUnrouted reads that queue the way Inspector reads a
// DLQ, never consuming it; Operator.ReplayUnrouted publishes selected events again to their
// exchange with their routing key, each in its own transaction with the removal of its
// copy (see the package documentation). The queue is shared by every
// service of the vhost: select by exchange.

// unroutedQueue is the queue that keeps events no queue was bound for.
const unroutedQueue = topology.UnroutedQueue

// Headers a restored event carries: an event put back into sluice.unrouted by hand (after
// its replay was returned) no longer has its exchange and routing key as delivery fields.
const (
	headerUnroutedExchange   = "x-unrouted-exchange"
	headerUnroutedRoutingKey = "x-unrouted-routing-key"
)

// ErrNoExchange means an event's exchange does not exist (any more); the event stays.
var ErrNoExchange = errors.New("dlq: exchange not found")

// UnroutedEvent is one event of sluice.unrouted.
type UnroutedEvent struct {
	// Position is the event's place in the queue, from 1 at the head.
	Position int `json:"position"`
	// ID is the event's id (see the package documentation, "Message ids").
	ID string `json:"id"`
	// Exchange and RoutingKey are what the event was published with.
	Exchange   string `json:"exchange"`
	RoutingKey string `json:"routing_key"`
	// Published is the AMQP timestamp, zero when the producer set none.
	Published time.Time `json:"published,omitzero"`
	// Replays is how often the event was replayed already (x-replay-count).
	Replays int `json:"replays"`
	// Headers are the event's headers, string values masked and bounded like a dead
	// letter's (see Record.MarshalJSON); Payload a masked preview of its body (at most 4
	// KiB) as text, Encoding "utf-8" or "base64"; PayloadBytes the body's size.
	Headers          amqp.Table `json:"headers"`
	Payload          string     `json:"payload"`
	Encoding         string     `json:"payload_encoding"`
	PayloadBytes     int        `json:"payload_bytes"`
	PayloadTruncated bool       `json:"payload_truncated"`
}

// newUnroutedEvent describes delivery d, read at position pos of sluice.unrouted.
func newUnroutedEvent(d amqp.Delivery, pos int) UnroutedEvent {
	ev := UnroutedEvent{Position: pos, ID: dlqwire.MessageID(d), Exchange: d.Exchange, RoutingKey: d.RoutingKey, Published: d.Timestamp,
		Headers: make(amqp.Table, len(d.Headers)), PayloadBytes: len(d.Body)}
	for k, v := range d.Headers {
		if text, ok := v.(string); ok {
			v = failure.Truncate(mask.Header(k, text), dlqview.HeaderValueBytes)
		}
		ev.Headers[k] = v
	}
	if x, ok := d.Headers[headerUnroutedExchange].(string); ok && (d.Exchange == "" || d.Exchange == topology.UnroutedExchange) {
		ev.Exchange = x
		ev.RoutingKey, _ = d.Headers[headerUnroutedRoutingKey].(string)
	}
	ev.Replays = replayCountOf(d.Headers)
	ev.Payload, ev.Encoding, ev.PayloadTruncated = dlqview.Preview(d.Body, dlqview.PreviewBytes)
	return ev
}

func replayCountOf(h amqp.Table) int {
	switch v := h[headers.ReplayCount].(type) {
	case string:
		return replayCount(v)
	case int32:
		return int(v)
	case int64:
		return int(v)
	}
	return 0
}

// UnroutedSelector selects events of sluice.unrouted. Every field set must match; the
// zero value selects every event.
type UnroutedSelector struct {
	// Exchange selects the events published to this exchange.
	Exchange string
	// RoutingKey selects the events published with exactly this routing key.
	RoutingKey string
	// IDs selects the events with these ids.
	IDs []string
}

// match reports whether sel selects ev.
func (sel UnroutedSelector) match(ev UnroutedEvent) bool {
	return (sel.Exchange == "" || sel.Exchange == ev.Exchange) &&
		(sel.RoutingKey == "" || sel.RoutingKey == ev.RoutingKey) &&
		(len(sel.IDs) == 0 || slices.Contains(sel.IDs, ev.ID))
}

// UnroutedListing is what ListUnrouted read.
type UnroutedListing struct {
	// Total is the number of ready events sluice.unrouted held when the listing started.
	Total int `json:"total"`
	// Events are the selected events, head first.
	Events []UnroutedEvent `json:"events"`
}

// ListUnrouted returns up to limit (<= 0: all) events of sluice.unrouted that sel selects,
// head first, leaving the queue as it was.
func ListUnrouted(ctx context.Context, conn *amqp.Connection, sel UnroutedSelector, limit int) (UnroutedListing, error) {
	l := UnroutedListing{Events: []UnroutedEvent{}}
	ch, total, err := openUnrouted(conn)
	if err != nil {
		return l, err
	}
	defer ch.Close() // gives back everything read, in order
	l.Total = total
	// Read all that was there at the start even when the limit is reached: on a quorum
	// queue a returned message goes to the tail, so only giving all back keeps the order.
	for n := 0; n < total; n++ {
		if err := ctx.Err(); err != nil {
			return l, err
		}
		d, ok, err := ch.Get(unroutedQueue, false)
		if err != nil {
			return l, fmt.Errorf("read %q: %w", unroutedQueue, err)
		}
		if !ok {
			break
		}
		if ev := newUnroutedEvent(d, n+1); sel.match(ev) && (limit <= 0 || len(l.Events) < limit) {
			l.Events = append(l.Events, ev)
		}
	}
	return l, nil
}

func openUnrouted(conn *amqp.Connection) (*amqp.Channel, int, error) {
	if conn == nil {
		return nil, 0, errNoConnection
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, 0, fmt.Errorf("open channel: %w", err)
	}
	q, err := ch.QueueDeclarePassive(unroutedQueue, true, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		if isNotFound(err) {
			return nil, 0, fmt.Errorf("queue %q (declared with sluice's first exchange): %w", unroutedQueue, sluice.ErrQueueNotFound)
		}
		return nil, 0, fmt.Errorf("check queue %q: %w", unroutedQueue, err)
	}
	return ch, q.Messages, nil
}

// UnroutedReplay says what Operator.ReplayUnrouted did.
type UnroutedReplay struct {
	DryRun bool `json:"dry_run"`
	// Scanned is how many events were read.
	Scanned int `json:"scanned"`
	// Replayed are the events published again, in queue order.
	Replayed []UnroutedEvent `json:"replayed"`
	// Failed are selected events left in sluice.unrouted, with why.
	Failed []Failure `json:"failed,omitempty"`
}

// String spells sel as the CLI's flags do.
func (sel UnroutedSelector) String() string {
	var parts []string
	if sel.Exchange != "" {
		parts = append(parts, "--exchange "+sel.Exchange)
	}
	if sel.RoutingKey != "" {
		parts = append(parts, "--routing-key "+sel.RoutingKey)
	}
	for _, id := range sel.IDs {
		parts = append(parts, "--id "+id)
	}
	if len(parts) == 0 {
		return "--all"
	}
	return strings.Join(parts, " ")
}

// ReplayUnrouted publishes the events of sluice.unrouted that sel selects again to their
// exchange with their routing key (mandatory), headers, properties and payload kept and
// x-replay-count incremented, removing each from sluice.unrouted in the same transaction.
// An event whose exchange is missing stays (ErrNoExchange). An event still nobody is bound
// for is routed back to sluice.unrouted by the exchange's alternate exchange, at the tail:
// a run reads only the events present at its start, so it never loops. With dry, nothing
// changes and Replayed says what would be published. It is recorded in the audit trail as
// the action "replay-unrouted" by o.Actor (a dry run is not recorded).
func (o Operator) ReplayUnrouted(ctx context.Context, sel UnroutedSelector, dry bool) (UnroutedReplay, error) {
	out := UnroutedReplay{DryRun: dry, Replayed: []UnroutedEvent{}}
	_, err := o.audited(ctx, opReplayUnrouted, unroutedQueue, unroutedQueue, sel.String(), Options{DryRun: dry}, func() (Result, error) {
		var err error
		out, err = replayUnrouted(ctx, o.Conn, sel, dry)
		res := Result{Op: opReplayUnrouted, Queue: unroutedQueue, Moved: len(out.Replayed)}
		for _, ev := range out.Replayed[:min(len(out.Replayed), auditIDs)] {
			res.IDs = append(res.IDs, ev.ID)
		}
		return res, err
	})
	return out, err
}

// opReplayUnrouted is the audit trail's name of ReplayUnrouted.
const opReplayUnrouted = "replay-unrouted"

func replayUnrouted(ctx context.Context, conn *amqp.Connection, sel UnroutedSelector, dry bool) (UnroutedReplay, error) {
	res := UnroutedReplay{DryRun: dry, Replayed: []UnroutedEvent{}}
	ch, total, err := openUnrouted(conn)
	if err != nil {
		return res, err
	}
	defer ch.Close() // gives back, in order, every event not replayed
	var returns <-chan amqp.Return
	if !dry {
		if err := ch.Tx(); err != nil {
			return res, fmt.Errorf("start transaction on %q: %w", unroutedQueue, err)
		}
		returns = ch.NotifyReturn(make(chan amqp.Return, 4))
	}
	var probe *amqp.Channel
	defer func() {
		if probe != nil {
			_ = probe.Close()
		}
	}()
	exchangeExists := func(name string) error {
		if probe == nil {
			if probe, err = conn.Channel(); err != nil {
				probe = nil
				return fmt.Errorf("open channel: %w", err)
			}
		}
		if err := probe.ExchangeDeclarePassive(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			probe = nil // a failed passive declare closes its channel
			if isNotFound(err) {
				return fmt.Errorf("exchange %q: %w", name, ErrNoExchange)
			}
			return fmt.Errorf("check exchange %q: %w", name, err)
		}
		return nil
	}
	for res.Scanned < total {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("replay from %q interrupted after %d of %d events: %w", unroutedQueue, res.Scanned, total, err)
		}
		d, ok, err := ch.Get(unroutedQueue, false)
		if err != nil {
			return res, fmt.Errorf("read %q: %w", unroutedQueue, err)
		}
		if !ok {
			break
		}
		res.Scanned++
		ev := newUnroutedEvent(d, res.Scanned)
		if !sel.match(ev) {
			continue
		}
		if ev.Exchange == "" || ev.Exchange == topology.UnroutedExchange {
			res.Failed = append(res.Failed, Failure{ID: ev.ID, Err: fmt.Errorf("event %q has no exchange to go back to: %w", ev.ID, ErrNoExchange)})
			continue
		}
		if err := exchangeExists(ev.Exchange); err != nil {
			res.Failed = append(res.Failed, Failure{ID: ev.ID, Destination: ev.Exchange, Err: err})
			if !errors.Is(err, ErrNoExchange) {
				return res, err
			}
			continue
		}
		if dry {
			res.Replayed = append(res.Replayed, ev)
			continue
		}
		pub := originalPublishing(d)
		kept := pub.Headers
		pub.Headers = amqp.Table{}
		for k, v := range kept {
			if k != headerUnroutedExchange && k != headerUnroutedRoutingKey {
				pub.Headers[k] = v
			}
		}
		pub.Headers[headers.ReplayCount] = strconv.Itoa(ev.Replays + 1)
		if err := ch.Publish(ev.Exchange, ev.RoutingKey, true, false, pub); err != nil {
			return res, fmt.Errorf("publish event %q to exchange %q: %w", ev.ID, ev.Exchange, err)
		}
		if err := ch.Ack(d.DeliveryTag, false); err != nil {
			return res, fmt.Errorf("acknowledge event %q in %q: %w", ev.ID, unroutedQueue, err)
		}
		if err := ch.TxCommit(); err != nil {
			return res, fmt.Errorf("commit replay of event %q to exchange %q: %w", ev.ID, ev.Exchange, err)
		}
		select {
		case ret := <-returns:
			// An exchange without sluice's alternate exchange returned it: put it back,
			// naming where it came from.
			if err := restoreUnrouted(ch, d, ev, returns); err != nil {
				return res, err
			}
			res.Failed = append(res.Failed, Failure{ID: ev.ID, Destination: ev.Exchange,
				Err: fmt.Errorf("event %q: exchange %q routes key %q nowhere and has no alternate exchange (%d %s); put back into %q",
					ev.ID, ev.Exchange, ev.RoutingKey, ret.ReplyCode, ret.ReplyText, unroutedQueue)})
			continue
		default:
		}
		ev.Replays++
		res.Replayed = append(res.Replayed, ev)
	}
	if len(res.Failed) > 0 {
		return res, fmt.Errorf("%d of %d selected events not replayed, still in %q; first: %w",
			len(res.Failed), len(res.Failed)+len(res.Replayed), unroutedQueue, res.Failed[0].Err)
	}
	return res, nil
}

// restoreUnrouted publishes the untouched event back into sluice.unrouted, with its
// exchange and routing key in headers, in a transaction of its own.
func restoreUnrouted(ch *amqp.Channel, d amqp.Delivery, ev UnroutedEvent, returns <-chan amqp.Return) error {
	pub := originalPublishing(d)
	kept := pub.Headers
	pub.Headers = amqp.Table{}
	for k, v := range kept {
		pub.Headers[k] = v
	}
	pub.Headers[headerUnroutedExchange] = ev.Exchange
	pub.Headers[headerUnroutedRoutingKey] = ev.RoutingKey
	fail := func(err error) error {
		return fmt.Errorf("event %q was returned by exchange %q and putting it back into %q failed (payload %q): %w", ev.ID, ev.Exchange, unroutedQueue, d.Body, err)
	}
	if err := ch.Publish("", unroutedQueue, true, false, pub); err != nil {
		return fail(err)
	}
	if err := ch.TxCommit(); err != nil {
		return fail(err)
	}
	select {
	case <-returns:
		return fail(errors.New("returned too"))
	default:
		return nil
	}
}
