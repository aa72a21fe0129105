package dlq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/internal/topology"
)

// ErrAuditUnavailable means an action's audit record could not be written (confirmed) on
// the audit exchange: a destructive action then does not run. When only the record of an
// action's result fails, the action has run and its Result says what it did.
var ErrAuditUnavailable = errors.New("dlq: audit record not written")

// Bounds of the audit queue when an action creates it. A queue that exists already
// (declared by an operator, or bounded by a policy) is used as it is.
const (
	// auditMaxLength is the audit queue's x-max-length: past it RabbitMQ drops the
	// oldest records.
	auditMaxLength = 100_000
	// auditRetention is the audit queue's x-message-ttl.
	auditRetention = 90 * 24 * time.Hour
	// auditIDs is how many ids an audit record lists.
	auditIDs = 100
	// auditTimeout bounds the wait for one record's confirm.
	auditTimeout = 10 * time.Second
)

// Audit record phases and results (AuditEvent.Result).
const (
	auditStarted = "started"
	auditOK      = "ok"
	auditFailed  = "failed"
)

// AuditEvent is one operator action as the audit trail records it, on the durable fanout
// exchange sluice.audit (Operator.AuditExchange) and the queue of that name, which an
// action creates when missing with x-max-length 100,000 and x-message-ttl 90 days (a queue
// that exists is used as it is). Each action writes two records with the same ID: one with
// Result "started" (Count 0), confirmed before the action changes anything, and one with
// its outcome ("ok" or "failed") once it ended. ReadAudit merges them into one event; a
// "started" event with no outcome is an action whose process died or lost its connection
// before recording the end.
type AuditEvent struct {
	// ID identifies the action.
	ID string `json:"id"`
	// Action is "replay", "archive", "purge", "edit" or "replay-unrouted".
	Action string `json:"action"`
	// Queue is Q, the queue whose dead letters were acted on ("sluice.unrouted" for
	// replay-unrouted); Source the queue read (Q.dlq or Q.dlq.archive).
	Queue  string `json:"queue"`
	Source string `json:"source,omitempty"`
	// Selector is the selection as the CLI would spell it ("--id a --id b", "--all").
	Selector string `json:"selector"`
	// Count is how many messages the action moved, deleted or edited.
	Count int `json:"count"`
	// IDs are the ids of the first 100 of them (a purge of a whole queue lists none).
	IDs []string `json:"ids,omitempty"`
	// Actor is who acted: "console:<token name>", or the OS user and host of the CLI or
	// program ("alice@host").
	Actor string `json:"actor"`
	// At is when the action started; Ended when its outcome was recorded.
	At    time.Time  `json:"at"`
	Ended *time.Time `json:"ended,omitempty"`
	// Result is "started", "ok" or "failed"; Error says why it failed.
	Result string `json:"result"`
	Error  string `json:"error,omitempty"`
	// ConfirmedCompensated says the actor confirmed replaying (or editing) dead letters
	// whose compensation was published (Options.Compensated: `sluice dlq replay
	// --compensated`, the console's confirmation), in both records; Compensated, in the
	// outcome, how many such messages the action moved.
	ConfirmedCompensated bool `json:"confirmed_compensated,omitempty"`
	Compensated          int  `json:"compensated,omitempty"`
}

// defaultActor is the actor of an Operator with none set: the OS user and host name.
func defaultActor() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return name + "@" + host
}

// auditLog writes an action's records on a confirm-mode channel of its own.
type auditLog struct {
	ch       *amqp.Channel
	exchange string
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
}

// openAudit declares the audit exchange and, when missing, its queue (bounded by
// auditMaxLength and auditRetention), bound to it.
func openAudit(conn *amqp.Connection, exchange string) (*auditLog, error) {
	if conn == nil {
		return nil, errNoConnection
	}
	ch, err := declareAudit(conn, exchange)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrAuditUnavailable, err)
	}
	return &auditLog{
		ch: ch, exchange: exchange,
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, 2)),
		returns:  ch.NotifyReturn(make(chan amqp.Return, 2)),
	}, nil
}

// declareAudit declares exchange, and its queue when missing, and returns a confirm-mode
// channel; on an error it leaves no channel open.
func declareAudit(conn *amqp.Connection, exchange string) (ch *amqp.Channel, err error) {
	if ch, err = conn.Channel(); err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	defer func() {
		if err != nil && ch != nil {
			_ = ch.Close() // a channel error closed it already; this is for the others
		}
	}()
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return ch, fmt.Errorf("declare exchange %q: %w", exchange, err)
	}
	if _, err := ch.QueueDeclarePassive(exchange, true, false, false, false, nil); err != nil {
		if !isNotFound(err) {
			return ch, fmt.Errorf("check queue %q: %w", exchange, err)
		}
		// The failed passive declare closed the channel.
		if ch, err = conn.Channel(); err != nil {
			return nil, fmt.Errorf("open channel: %w", err)
		}
		args := amqp.Table{"x-max-length": int64(auditMaxLength), "x-message-ttl": auditRetention.Milliseconds()}
		if _, err := ch.QueueDeclare(exchange, true, false, false, false, args); err != nil {
			return ch, fmt.Errorf("declare queue %q: %w", exchange, err)
		}
	}
	if err := ch.QueueBind(exchange, "", exchange, false, nil); err != nil {
		return ch, fmt.Errorf("bind queue %q: %w", exchange, err)
	}
	if err := ch.Confirm(false); err != nil {
		return ch, fmt.Errorf("confirm mode: %w", err)
	}
	return ch, nil
}

func (a *auditLog) close() { _ = a.ch.Close() }

// write publishes ev, persistent and mandatory, and waits for RabbitMQ's confirm: a nack
// (a full queue with overflow reject-publish) or a return (no queue bound) is an error.
func (a *auditLog) write(ctx context.Context, ev AuditEvent) error {
	body, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("%w: encode: %w", ErrAuditUnavailable, err)
	}
	pub := amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent,
		MessageId: ev.ID, Timestamp: time.Now(), Type: "sluice.audit." + ev.Result, Body: body,
	}
	if err := a.ch.PublishWithContext(ctx, a.exchange, "", true, false, pub); err != nil {
		return fmt.Errorf("%w: publish to %q: %w", ErrAuditUnavailable, a.exchange, err)
	}
	timer := time.NewTimer(auditTimeout)
	defer timer.Stop()
	select {
	case c, ok := <-a.confirms:
		if !ok {
			return fmt.Errorf("%w: channel closed before RabbitMQ confirmed the record on %q", ErrAuditUnavailable, a.exchange)
		}
		if !c.Ack {
			return fmt.Errorf("%w: RabbitMQ refused the record on %q (a full audit queue with overflow reject-publish?)", ErrAuditUnavailable, a.exchange)
		}
	case <-timer.C:
		return fmt.Errorf("%w: no confirm from RabbitMQ within %s on %q", ErrAuditUnavailable, auditTimeout, a.exchange)
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrAuditUnavailable, ctx.Err())
	}
	// RabbitMQ sends a mandatory publish's return before its confirm.
	select {
	case r := <-a.returns:
		return fmt.Errorf("%w: record returned by %q (%d %s): no queue is bound to it", ErrAuditUnavailable, a.exchange, r.ReplyCode, r.ReplyText)
	default:
	}
	return nil
}

// audited runs fn as the audited action op on queue: the "started" record is confirmed
// first (else fn does not run), the outcome is recorded after. A dry run is not an action
// and is not recorded.
func (o Operator) audited(ctx context.Context, op, queue, source, selector string, opts Options, fn func() (Result, error)) (Result, error) {
	if opts.DryRun {
		return fn()
	}
	ev, log, err := o.auditStart(ctx, op, queue, source, selector, opts.Compensated && (op == opReplay || op == opEdit))
	if err != nil {
		return Result{Op: op, Queue: queue, Source: source}, fmt.Errorf("%s of %q not started: %w", op, queue, err)
	}
	defer log.close()
	res, err := fn()
	ev.Compensated = res.Compensated
	if endErr := o.auditEnd(ctx, log, ev, res.Moved, res.IDs, err); endErr != nil {
		endErr = fmt.Errorf("%s of %q done (%d moved) but its outcome is not in the audit trail: %w", op, queue, res.Moved, endErr)
		if err == nil {
			return res, endErr
		}
		return res, errors.Join(err, endErr)
	}
	return res, err
}

func (o Operator) auditStart(ctx context.Context, op, queue, source, selector string, confirmed bool) (AuditEvent, *auditLog, error) {
	log, err := openAudit(o.Conn, o.auditExchange())
	if err != nil {
		return AuditEvent{}, nil, err
	}
	var raw [12]byte
	_, _ = rand.Read(raw[:])
	ev := AuditEvent{ID: hex.EncodeToString(raw[:]), Action: op, Queue: queue, Source: source, Selector: selector,
		Actor: o.actor(), At: now(o.Now).UTC(), Result: auditStarted, ConfirmedCompensated: confirmed}
	if err := log.write(ctx, ev); err != nil {
		log.close()
		return ev, nil, err
	}
	return ev, log, nil
}

func (o Operator) auditEnd(ctx context.Context, log *auditLog, ev AuditEvent, count int, ids []string, err error) error {
	ended := now(o.Now).UTC()
	ev.Ended, ev.Count, ev.IDs, ev.Result = &ended, count, ids, auditOK
	if err != nil {
		ev.Result, ev.Error = auditFailed, err.Error()
	}
	// The action's context may be what ended it; its outcome is still recorded.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), auditTimeout)
	defer cancel()
	return log.write(ctx, ev)
}

func (o Operator) auditExchange() string {
	if o.AuditExchange != "" {
		return o.AuditExchange
	}
	return topology.Audit
}

// AuditQuery selects the events ReadAudit returns. The zero value returns every event of
// "sluice.audit".
type AuditQuery struct {
	// Exchange is the audit exchange (and queue). Empty means "sluice.audit".
	Exchange string
	// Queue keeps only the events of this queue.
	Queue string
	// Since keeps only the events started at or after it.
	Since time.Time
}

// ReadAudit returns the audit trail's events, oldest first, each action once (see
// AuditEvent), leaving the audit queue as it was. A trail that was never written is empty,
// not an error.
func ReadAudit(ctx context.Context, conn *amqp.Connection, q AuditQuery) ([]AuditEvent, error) {
	if conn == nil {
		return nil, errNoConnection
	}
	name := q.Exchange
	if name == "" {
		name = topology.Audit
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	info, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		if isNotFound(err) {
			return []AuditEvent{}, nil
		}
		_ = ch.Close()
		return nil, fmt.Errorf("check audit queue %q: %w", name, err)
	}
	rd, err := newReader(conn, ch, name, info.Messages, defaultWindow, 0, nil)
	if err != nil {
		_ = ch.Close()
		return nil, err
	}
	defer rd.close() // gives every record back, in order
	byID := map[string]int{}
	events := []AuditEvent{}
	for {
		d, _, ok, err := rd.next(ctx)
		if err != nil {
			return nil, fmt.Errorf("read audit queue %q: %w", name, err)
		}
		if !ok {
			break
		}
		rd.hold(d)
		var ev AuditEvent
		if err := json.Unmarshal(d.Body, &ev); err != nil || ev.ID == "" {
			// Not sluice's: someone else published on the exchange. Shown, not hidden.
			ev = AuditEvent{ID: d.MessageId, Action: "unknown", Result: auditFailed, At: d.Timestamp.UTC(),
				Error: fmt.Sprintf("not an audit record: %.200q", d.Body)}
		}
		if i, seen := byID[ev.ID]; seen && ev.ID != "" {
			if ev.Result != auditStarted {
				events[i] = ev
			}
			continue
		}
		byID[ev.ID] = len(events)
		events = append(events, ev)
	}
	return slices.DeleteFunc(events, func(ev AuditEvent) bool {
		return (q.Queue != "" && ev.Queue != q.Queue) || (!q.Since.IsZero() && ev.At.Before(q.Since))
	}), nil
}
