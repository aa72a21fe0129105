package dlq

import (
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice"
	sluiceamqp "github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/dlqwire"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
)

// Record is one dead-lettered message as an operator sees it: its failure record (the
// headers package poison writes), its other headers, AMQP properties and payload.
type Record struct {
	// ID identifies the message (see the package doc for the fallbacks).
	ID string `json:"id"`
	// Position is the message's place in the DLQ when it was read, the head being 1.
	Position int `json:"position"`
	// OriginalQueue is where a replay sends the message: x-original-queue (else RabbitMQ's
	// x-first-death-queue) when it names Q or one of Q's partitions, else Q.
	OriginalQueue string `json:"original_queue"`
	// IgnoredOrigin is the recorded origin OriginalQueue does not follow, because it named
	// another queue than Q or its partitions (a producer's header); empty otherwise.
	IgnoredOrigin string `json:"ignored_origin,omitempty"`
	// ProducerOriginalQueue is the x-original-queue the message arrived with from its
	// producer, when it named another queue (x-producer-original-queue). Display only.
	ProducerOriginalQueue string `json:"producer_original_queue,omitempty"`
	// FailedStage names the step that failed when it was not the handler (x-failed-stage),
	// for example "idempotency key function"; Handler is then empty.
	FailedStage string `json:"failed_stage,omitempty"`
	// RetryNote says how many attempts were made here and what retry count the message
	// arrived with ("arrived with x-retry-count 99; 1 attempt made here").
	RetryNote string `json:"retry_note,omitempty"`
	// Handler is the Watermill handler that failed (x-handler).
	Handler string `json:"handler,omitempty"`
	// GroupID is the message's failure group (see Group and fingerprint.go).
	GroupID string `json:"group_id"`
	// Fingerprint says where the message failed: a panic's top stack frames, else its
	// normalized error message (see fingerprint.go).
	Fingerprint string `json:"fingerprint"`
	// ErrorType is x-error-type, else x-last-error, else "rabbitmq.<reason>" for a message
	// RabbitMQ dead-lettered itself (x-first-death-reason), else empty.
	ErrorType string `json:"error_type"`
	// ErrorClass is x-error-class ("permanent", "retryable", ...).
	ErrorClass string `json:"error_class,omitempty"`
	// Reason is why the message was dead-lettered (x-dead-letter-reason: permanent,
	// retries_exhausted, max_age, retry_unlikely, retry_budget_exhausted, ...; see
	// decide.ReasonOf), or "rabbitmq.<reason>" for a message RabbitMQ
	// dead-lettered itself; empty for a dead letter sluice of an older version wrote.
	Reason string `json:"reason,omitempty"`
	// ErrorMessage is x-error-message, else x-last-error-message.
	ErrorMessage string `json:"error_message"`
	// ErrorStack is a recovered panic's stack (x-error-stack).
	ErrorStack string `json:"error_stack,omitempty"`
	// Retries is the retry count the message had when it was dead-lettered.
	Retries int `json:"retries"`
	// Replays is how many times the message was replayed before (x-replay-count).
	Replays int `json:"replays"`
	// FailedAt is x-failed-at, else the AMQP timestamp; zero when neither is usable.
	FailedAt time.Time `json:"-"`
	// FirstFailureAt is x-first-failure-time; zero when absent.
	FirstFailureAt time.Time `json:"-"`
	// Age is how long ago FailedAt was when the record was read; valid when HasAge.
	Age    time.Duration `json:"-"`
	HasAge bool          `json:"-"`
	// FailedHost and FailedPID say which process dead-lettered the message.
	FailedHost string `json:"failed_host,omitempty"`
	FailedPID  string `json:"failed_pid,omitempty"`
	// History is the bounded list of failed attempts (x-retry-history).
	History []failure.HistoryEntry `json:"history,omitempty"`
	// Headers are all AMQP headers in text form (see broker/amqp.Marshaler), the failure
	// record included; Watermill's id header is in ID.
	Headers map[string]string `json:"headers"`
	// Properties are the AMQP basic properties.
	Properties properties `json:"properties"`
	// Payload is the body, byte for byte.
	Payload []byte `json:"-"`

	// sameID are the positions of the other messages with this id (see Inspector.ShowAll).
	sameID []int
}

// properties are a message's AMQP basic properties.
type properties struct {
	ContentType     string    `json:"content_type,omitempty"`
	ContentEncoding string    `json:"content_encoding,omitempty"`
	DeliveryMode    uint8     `json:"delivery_mode,omitempty"`
	Priority        uint8     `json:"priority,omitempty"`
	CorrelationID   string    `json:"correlation_id,omitempty"`
	ReplyTo         string    `json:"reply_to,omitempty"`
	Expiration      string    `json:"expiration,omitempty"`
	MessageID       string    `json:"message_id,omitempty"`
	Timestamp       time.Time `json:"timestamp,omitzero"`
	Type            string    `json:"type,omitempty"`
	UserID          string    `json:"user_id,omitempty"`
	AppID           string    `json:"app_id,omitempty"`
}

// MarshalJSON writes the record's display form (see Display): masked and bounded, the
// payload as a preview with its size. The exact payload is Payload.
func (r Record) MarshalJSON() ([]byte, error) {
	return r.Display().MarshalJSON()
}

// newRecord reads the record of a delivery from queue's DLQ at position pos, with ages
// measured against now.
func newRecord(d amqp.Delivery, queue string, pos int, now time.Time) Record {
	// The marshaler's text form of headers is the one the rest of sluice reads, so the
	// record shows what a handler would see.
	msg, _ := sluiceamqp.Marshaler{}.Unmarshal(d) // never fails
	md := msg.Metadata
	r := Record{
		ID:            dlqwire.MessageID(d),
		Position:      pos,
		OriginalQueue: originalQueue(d, md.Get(sluice.HeaderOriginalQueue)),
		Handler:       md.Get(headers.Handler),
		ErrorType:     md.Get(sluice.HeaderErrorType),
		ErrorClass:    md.Get(headers.ErrorClass),
		Reason:        md.Get(headers.DeadLetterReason),
		ErrorMessage:  md.Get(sluice.HeaderErrorMessage),
		ErrorStack:    md.Get(sluice.HeaderErrorStack),
		FailedStage:   md.Get(headers.FailedStage),
		RetryNote:     headers.RetryNote(md),
		Retries:       sluice.RetryCount(md),
		Replays:       replayCount(md.Get(headers.ReplayCount)),
		FailedHost:    md.Get(headers.FailedHost),
		FailedPID:     md.Get(headers.FailedPID),
		History:       failure.History(md),
		Headers:       make(map[string]string, len(md)),
		Properties: properties{
			ContentType:     d.ContentType,
			ContentEncoding: d.ContentEncoding,
			DeliveryMode:    d.DeliveryMode,
			Priority:        d.Priority,
			CorrelationID:   d.CorrelationId,
			ReplyTo:         d.ReplyTo,
			Expiration:      d.Expiration,
			MessageID:       d.MessageId,
			Timestamp:       d.Timestamp,
			Type:            d.Type,
			UserID:          d.UserId,
			AppID:           d.AppId,
		},
		Payload: d.Body,
	}
	r.ProducerOriginalQueue = md.Get(headers.ProducerOriginalQueue)
	r.resolveOrigin(queue)
	if r.ErrorType == "" {
		r.ErrorType = md.Get(sluice.HeaderLastError)
	}
	if r.ErrorMessage == "" {
		r.ErrorMessage = md.Get(sluice.HeaderLastErrorMessage)
	}
	if reason := md.Get("x-first-death-reason"); r.ErrorType == "" && reason != "" {
		// RabbitMQ dead-lettered it (a quorum queue's delivery limit, a rejection, a TTL).
		r.ErrorType = "rabbitmq." + reason
		if r.Reason == "" {
			r.Reason = r.ErrorType
		}
		if r.ErrorMessage == "" {
			r.ErrorMessage = "dead-lettered by RabbitMQ (" + reason + ") from queue " + md.Get("x-first-death-queue")
		}
	}
	r.Fingerprint = cachedFingerprint(r.ErrorType, r.ErrorMessage, r.ErrorStack)
	r.GroupID = groupID(r.Handler, r.ErrorType, r.Fingerprint)
	for k, v := range md {
		// Properties and delivery facts are in Properties; a header is shown by its name.
		if name, ok := headers.HeaderName(k); ok {
			r.Headers[name] = v
		}
	}
	if t, ok := failure.Time(md, headers.FailedAt, now); ok {
		r.FailedAt = t
	} else if !d.Timestamp.IsZero() {
		r.FailedAt = d.Timestamp
	}
	if !r.FailedAt.IsZero() {
		r.Age, r.HasAge = max(now.Sub(r.FailedAt), 0), true
	}
	if t, ok := failure.Time(md, headers.FirstFailureTime, now); ok {
		r.FirstFailureAt = t
	}
	return r
}

// replayCount reads x-replay-count; anything but a non-negative number counts as 0.
func replayCount(raw string) int {
	n, err := strconv.Atoi(strings.TrimSpace(raw))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// ShortError returns the first line of the record's error message cut to n bytes, for
// tables.
func (r Record) ShortError(n int) string {
	msg := r.ErrorMessage
	if i := strings.IndexAny(msg, "\r\n"); i >= 0 {
		msg = msg[:i]
	}
	return failure.Truncate(msg, n)
}

// originalQueue is where a message came from: sluice's x-original-queue, else, for a
// message RabbitMQ dead-lettered itself (a quorum queue's delivery limit), the queue its
// x-first-death-queue names.
func originalQueue(d amqp.Delivery, fromSluice string) string {
	if fromSluice != "" {
		return fromSluice
	}
	if q, ok := d.Headers["x-first-death-queue"].(string); ok {
		return q
	}
	return ""
}

// resolveOrigin makes OriginalQueue a queue a replay may go to: the recorded origin when
// it is Q or one of Q's partitions, else Q (the recorded one kept in IgnoredOrigin).
func (r *Record) resolveOrigin(queue string) {
	switch {
	case r.OriginalQueue == "":
		r.OriginalQueue = queue
	case !headers.OwnOrigin(queue, r.OriginalQueue):
		r.IgnoredOrigin, r.OriginalQueue = r.OriginalQueue, queue
	}
}

// selectionRecord is the part of NewRecord a Selector and a move need (id, original queue,
// error type and message, stack, reason, handler, group, failure time, replays), read straight
// from the AMQP headers: a bulk move reads every message of the DLQ, and decoding the
// whole record cost it more than the move itself. It agrees with NewRecord on every field
// it fills.
func selectionRecord(d amqp.Delivery, queue string, pos int, now time.Time) Record {
	h := func(key string) string {
		v, _ := d.Headers[key].(string)
		return v
	}
	if !plainHeaders(d.Headers) {
		return newRecord(d, queue, pos, now)
	}
	r := Record{
		ID:            dlqwire.MessageID(d),
		Position:      pos,
		OriginalQueue: originalQueue(d, h(sluice.HeaderOriginalQueue)),
		Handler:       h(headers.Handler),
		ErrorType:     h(sluice.HeaderErrorType),
		ErrorMessage:  h(sluice.HeaderErrorMessage),
		ErrorStack:    h(sluice.HeaderErrorStack),
		Reason:        h(headers.DeadLetterReason),
		Replays:       replayCount(h(headers.ReplayCount)),
		Payload:       d.Body,
	}
	r.resolveOrigin(queue)
	if r.ErrorType == "" {
		r.ErrorType = h(sluice.HeaderLastError)
	}
	if r.ErrorMessage == "" {
		r.ErrorMessage = h(sluice.HeaderLastErrorMessage)
	}
	if reason := h("x-first-death-reason"); r.ErrorType == "" && reason != "" {
		r.ErrorType = "rabbitmq." + reason
		if r.Reason == "" {
			r.Reason = r.ErrorType
		}
		if r.ErrorMessage == "" {
			r.ErrorMessage = "dead-lettered by RabbitMQ (" + reason + ") from queue " + h("x-first-death-queue")
		}
	}
	r.Fingerprint = cachedFingerprint(r.ErrorType, r.ErrorMessage, r.ErrorStack)
	r.GroupID = groupID(r.Handler, r.ErrorType, r.Fingerprint)
	if t, err := time.Parse(time.RFC3339Nano, h(headers.FailedAt)); err == nil && !t.After(now.Add(time.Minute)) {
		r.FailedAt = t
	} else if !d.Timestamp.IsZero() {
		r.FailedAt = d.Timestamp
	}
	if !r.FailedAt.IsZero() {
		r.Age, r.HasAge = max(now.Sub(r.FailedAt), 0), true
	}
	return r
}

// plainHeaders reports whether the failure-record headers selectionRecord reads are all
// strings (as sluice writes them) or absent; anything else takes NewRecord's full decoding.
func plainHeaders(t amqp.Table) bool {
	for _, k := range []string{sluice.HeaderOriginalQueue, headers.Handler, sluice.HeaderErrorType,
		sluice.HeaderErrorMessage, sluice.HeaderErrorStack, headers.ReplayCount, sluice.HeaderLastError,
		sluice.HeaderLastErrorMessage, headers.FailedAt, "x-first-death-reason", headers.DeadLetterReason} {
		if v, ok := t[k]; ok {
			if _, isString := v.(string); !isString {
				return false
			}
		}
	}
	return true
}
