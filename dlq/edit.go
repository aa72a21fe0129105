package dlq

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strings"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
)

// ErrEditRefused means an edit was refused before anything changed: an invalid payload or
// header, or nothing to change. Its message says which and why.
var ErrEditRefused = errors.New("dlq: edit refused")

// Limits of an edit. RabbitMQ accepts larger messages; an edit is an operator's hand
// correction of one message, and a larger payload is far more likely a mistake (a wrong
// file) than a fix.
const (
	// MaxEditPayload is the largest payload an edit publishes: 1 MiB.
	MaxEditPayload = 1 << 20
	// MaxEditHeaderValue is the longest header value an edit sets: 4 KiB.
	MaxEditHeaderValue = 4 << 10
	// maxHeaderName is AMQP's limit on a table key (a short string).
	maxHeaderName = 255
)

// Headers an edited copy carries.
const (
	// HeaderEditedAt is when the copy was edited (RFC 3339).
	HeaderEditedAt = "x-sluice-edited-at"
	// HeaderEditedBy is who edited it (Operator.Actor).
	HeaderEditedBy = "x-sluice-edited-by"
	// HeaderOriginalSHA256 is the SHA-256 of the payload before the edit, hex-encoded; the
	// original itself is in the archive.
	HeaderOriginalSHA256 = "x-sluice-original-sha256"
)

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

// Validate reports an edit that changes nothing, a payload or header past the limits, or a
// header sluice owns (the retry state, the failure record, the message id, the trace
// context, RabbitMQ's x-death): an edit corrects the message, never its history. Every
// error matches ErrEditRefused.
func (e Edit) Validate() error {
	switch {
	case e.ID == "":
		return fmt.Errorf("%w: no message id", ErrEditRefused)
	case e.Payload == nil && len(e.SetHeaders) == 0 && len(e.UnsetHeaders) == 0:
		return fmt.Errorf("%w: nothing to change: give a payload or a header to set or unset", ErrEditRefused)
	case len(e.Payload) > MaxEditPayload:
		return fmt.Errorf("%w: payload of %d bytes is over the %d-byte limit", ErrEditRefused, len(e.Payload), MaxEditPayload)
	}
	for k, v := range e.SetHeaders {
		if err := checkEditHeader(k); err != nil {
			return err
		}
		if len(v) > MaxEditHeaderValue {
			return fmt.Errorf("%w: header %q: value of %d bytes is over the %d-byte limit", ErrEditRefused, k, len(v), MaxEditHeaderValue)
		}
		if !utf8.ValidString(v) {
			return fmt.Errorf("%w: header %q: value is not UTF-8", ErrEditRefused, k)
		}
	}
	for _, k := range e.UnsetHeaders {
		if err := checkEditHeader(k); err != nil {
			return err
		}
		if _, set := e.SetHeaders[k]; set {
			return fmt.Errorf("%w: header %q is both set and unset", ErrEditRefused, k)
		}
	}
	return nil
}

func checkEditHeader(k string) error {
	switch {
	case k == "" || len(k) > maxHeaderName:
		return fmt.Errorf("%w: header name %q: must be 1 to %d bytes", ErrEditRefused, k, maxHeaderName)
	case editReserved(k):
		return fmt.Errorf("%w: header %q is sluice's or RabbitMQ's record of the message and cannot be edited", ErrEditRefused, k)
	}
	return nil
}

// editReserved reports whether key is a header an edit may not touch.
func editReserved(key string) bool {
	k := strings.ToLower(key)
	if k == headers.UUID || k == sluice.HeaderOriginalQueue || k == headers.TraceParent || k == headers.TraceState ||
		k == headers.ReplayCount || k == headers.ReplayedAt || k == headerArchivedAt || k == headers.Dropped ||
		resetOnReplay[k] || headers.BrokerOwned(key) || headers.BrokerOwned(k) { // CC and BCC are upper case
		return true
	}
	for _, p := range []string{"x-sluice-", "x-producer-", "sluice-", "x-retry-", "x-error-", "x-failed-"} {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// EditResult says what Edit did.
type EditResult struct {
	Result
	// ID is the id of the edited copy: the original's.
	ID string `json:"id"`
	// Archive is where the original went (Q.dlq.archive).
	Archive string `json:"archive"`
	// OriginalSHA256 is the original payload's SHA-256 (HeaderOriginalSHA256).
	OriginalSHA256 string `json:"original_sha256"`
}

// Edit publishes a corrected copy of the message of queue's DLQ with id e.ID to its
// original queue, as a replay does (retry state reset, message id, correlation id, trace
// context and history kept), with e's payload and headers and HeaderEditedAt,
// HeaderEditedBy and HeaderOriginalSHA256 added; and moves the original, unchanged, to
// Q.dlq.archive (created as Archive creates it). Both publishes and the original's removal
// are one transaction: the original is never lost, and never both kept and replayed. When
// several messages share the id, the first (oldest) is edited. Errors match ErrEditRefused
// (nothing changed), ErrMessageNotFound (the id is no longer in the DLQ),
// ErrDestinationNotFound or ErrAuditUnavailable.
func (o *Operator) Edit(ctx context.Context, queue string, e Edit, opts Options) (EditResult, error) {
	out := EditResult{ID: e.ID, Archive: archiveName(queue)}
	if err := e.Validate(); err != nil {
		out.Result = Result{Op: opEdit, Queue: queue}
		return out, err
	}
	if opts.From == FromArchive || opts.To != "" || opts.DryRun {
		out.Result = Result{Op: opEdit, Queue: queue}
		return out, fmt.Errorf("%w: an edit reads Q.dlq and replays to the message's original queue (no From, To or DryRun)", ErrEditRefused)
	}
	sel := Selector{IDs: []string{e.ID}}
	var err error
	out.Result, err = o.audited(ctx, opEdit, queue, dlqName(queue), sel.String(), false, func() (Result, error) {
		return o.runEdit(ctx, queue, sel, opts, &e, &out)
	})
	return out, err
}

func (o *Operator) runEdit(ctx context.Context, queue string, sel Selector, opts Options, e *Edit, out *EditResult) (Result, error) {
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
	pub.Headers[HeaderEditedAt] = failure.FormatTime(m.now)
	pub.Headers[HeaderEditedBy] = ed.actor
	pub.Headers[HeaderOriginalSHA256] = ed.out.OriginalSHA256
	return pub
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

func (o *Operator) actor() string {
	if o.Actor != "" {
		return o.Actor
	}
	return DefaultActor()
}
