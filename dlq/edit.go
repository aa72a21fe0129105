package dlq

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"mime"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/internal/dlqwire"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
)

// ErrEditRefused means an edit was refused before anything changed: an invalid payload or
// header, or nothing to change. Its message says which and why. Limits: a payload of at
// most 1 MiB, header values of at most 4 KiB; sluice's and RabbitMQ's own headers (the
// retry state, the failure record, the message id, the trace context, x-death) cannot be
// set or unset.
var ErrEditRefused = dlqwire.ErrEditRefused

// Edit is a correction of one dead-lettered message.
type Edit struct {
	// ID is the message's id (Record.ID). Required.
	ID string
	// Payload replaces the payload. Nil keeps it; a message whose content type is JSON
	// (application/json or any +json type) must get a payload that parses.
	Payload []byte
	// SetHeaders sets headers (string values) on the copy.
	SetHeaders map[string]string
	// UnsetHeaders removes headers from the copy.
	UnsetHeaders []string
}

// EditResult says what Edit did.
type EditResult struct {
	Result
	// ID is the id of the edited copy: the original's.
	ID string `json:"id"`
	// Archive is where the original went (Q.dlq.archive).
	Archive string `json:"archive"`
	// OriginalSHA256 is the original payload's SHA-256 (header x-sluice-original-sha256).
	OriginalSHA256 string `json:"original_sha256"`
}

// Edit publishes a corrected copy of the message of queue's DLQ with id e.ID to its
// original queue, as a replay does (retry state reset, message id, correlation id, trace
// context and history kept), with e's payload and headers and x-sluice-edited-at (RFC
// 3339), x-sluice-edited-by (Actor) and x-sluice-original-sha256 (the old payload's
// SHA-256, hex) added; and moves the original, unchanged, to Q.dlq.archive (created as
// Archive creates it). Both publishes and the original's removal are one transaction: the original is never lost, and never both kept and replayed. When
// several messages share the id, the first (oldest) is edited. Errors match ErrEditRefused
// (nothing changed), ErrCompensated (the message's compensation was published and
// opts.Compensated does not confirm processing it again: nothing changed),
// ErrMessageNotFound (the id is no longer in the DLQ), ErrDestinationNotFound or
// ErrAuditUnavailable.
func (o Operator) Edit(ctx context.Context, queue string, e Edit, opts Options) (EditResult, error) {
	out := EditResult{ID: e.ID, Archive: archiveName(queue)}
	if err := dlqwire.CheckEdit(e.ID, e.Payload, e.SetHeaders, e.UnsetHeaders); err != nil {
		out.Result = Result{Op: opEdit, Queue: queue}
		return out, err
	}
	if opts.From == FromArchive || opts.To != "" || opts.DryRun {
		out.Result = Result{Op: opEdit, Queue: queue}
		return out, fmt.Errorf("%w: an edit reads Q.dlq and replays to the message's original queue (no From, To or DryRun)", ErrEditRefused)
	}
	sel := Selector{IDs: []string{e.ID}}
	var err error
	out.Result, err = o.audited(ctx, opEdit, queue, dlqName(queue), sel.String(), opts, func() (Result, error) {
		return o.runEdit(ctx, queue, sel, opts, &e, &out)
	})
	return out, err
}

func (o Operator) runEdit(ctx context.Context, queue string, sel Selector, opts Options, e *Edit, out *EditResult) (Result, error) {
	return o.runWith(ctx, opEdit, queue, sel, opts, func(m *mover) {
		m.edit = &editing{Edit: e, actor: o.actor(), out: out}
	})
}

// editing is an Edit under way.
type editing struct {
	*Edit
	actor string
	out   *EditResult
}

// check returns the error an edit of d is refused with: a JSON message given a payload
// that does not parse.
func (ed *editing) check(d amqp.Delivery) error {
	if ed.Payload == nil || !isJSON(d.ContentType) {
		return nil
	}
	var v any
	if err := json.Unmarshal(ed.Payload, &v); err != nil {
		return fmt.Errorf("%w: message %q has content type %q and the new payload is not valid JSON: %w", ErrEditRefused, ed.ID, d.ContentType, err)
	}
	return nil
}

// publishing returns pub (the replayed copy of d) edited.
func (ed *editing) publishing(d amqp.Delivery, pub amqp.Publishing, m *mover) amqp.Publishing {
	sum := sha256.Sum256(d.Body)
	ed.out.OriginalSHA256 = hex.EncodeToString(sum[:])
	if ed.Payload != nil {
		pub.Body = ed.Payload
	}
	for _, k := range ed.UnsetHeaders {
		delete(pub.Headers, k)
	}
	for k, v := range ed.SetHeaders {
		pub.Headers[k] = v
	}
	pub.Headers[headers.EditedAt] = failure.FormatTime(m.now)
	pub.Headers[headers.EditedBy] = ed.actor
	pub.Headers[headers.OriginalSHA256] = ed.out.OriginalSHA256
	return pub
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

func (o Operator) actor() string {
	if o.Actor != "" {
		return o.Actor
	}
	return defaultActor()
}
