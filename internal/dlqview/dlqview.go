// Package dlqview is how an operator sees a dead letter: the display form of a dlq.Record
// (credentials masked, every text bounded, the payload a preview) that dlq.Record's JSON,
// the sluice CLI and the console show, and the summary a list shows. It is presentation,
// not part of dlq's API: a Go program reads the exact Record, and json.Marshal of a Record
// gives its display form.
//
// Record is a copy of dlq.Record's fields, so that dlq (whose MarshalJSON writes the
// display form) can import this package: dlq converts a dlq.Record into a Record, and so
// does a caller (dlqview.Record(rec)), and the compiler keeps both field lists identical.
package dlqview

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/mask"
)

// Display bounds: what an operator reads of a dead letter (`sluice dlq show`, the
// console's pages, its JSON API) is bounded whatever a producer sent, so a page stays
// small (under 1 MiB) and a terminal stays usable. The exact message is still there:
// `show --payload-file`, `show --full` and the console's download give the payload byte
// for byte.
const (
	// PreviewBytes is how many bytes of a payload are shown (of its text, or of its
	// base64 form when it is not UTF-8).
	PreviewBytes = 4096
	// HeaderValueBytes is how many bytes of one header value are shown.
	HeaderValueBytes = 1024
	// MaxHeadersShown is how many headers are shown, in name order; the count of the
	// others is said.
	MaxHeadersShown = 64
	// ErrorTextBytes is how many bytes of the error message and of the stack are shown.
	ErrorTextBytes = 8192
	// SummaryErrorBytes is how many bytes of the error message a list's summary carries.
	SummaryErrorBytes = 200
)

// maskSlack is how far past a cut the payload is masked before it is cut, so that a URL
// straddling the cut is masked whole and no prefix of its password shows.
const maskSlack = 1024

// MaskingNote says what the display masks, and that the message itself is unchanged.
const MaskingNote = "display only: passwords in URLs and Authorization-like header values are shown as xxxxx; the message itself (replay, download, --payload-file) keeps the exact bytes"

// Record has exactly the fields of dlq.Record, in its order, with its JSON names (see
// dlq.Record for what each means; dlq's tests compare the two).
type Record struct {
	ID                    string                 `json:"id"`
	Position              int                    `json:"position"`
	OriginalQueue         string                 `json:"original_queue"`
	IgnoredOrigin         string                 `json:"ignored_origin,omitempty"`
	ProducerOriginalQueue string                 `json:"producer_original_queue,omitempty"`
	FailedStage           string                 `json:"failed_stage,omitempty"`
	RetryNote             string                 `json:"retry_note,omitempty"`
	Handler               string                 `json:"handler,omitempty"`
	GroupID               string                 `json:"group_id"`
	Fingerprint           string                 `json:"fingerprint"`
	ErrorType             string                 `json:"error_type"`
	ErrorClass            string                 `json:"error_class,omitempty"`
	Reason                string                 `json:"reason,omitempty"`
	ErrorMessage          string                 `json:"error_message"`
	CompensationID        string                 `json:"compensation_id,omitempty"`
	CompensationTo        string                 `json:"compensation_to,omitempty"`
	CompensationError     string                 `json:"compensation_error,omitempty"`
	ErrorStack            string                 `json:"error_stack,omitempty"`
	Retries               int                    `json:"retries"`
	Replays               int                    `json:"replays"`
	FailedAt              time.Time              `json:"-"`
	FirstFailureAt        time.Time              `json:"-"`
	Age                   time.Duration          `json:"-"`
	HasAge                bool                   `json:"-"`
	FailedHost            string                 `json:"failed_host,omitempty"`
	FailedPID             string                 `json:"failed_pid,omitempty"`
	History               []failure.HistoryEntry `json:"history,omitempty"`
	Headers               map[string]string      `json:"headers"`
	Properties            Properties             `json:"properties"`
	Payload               []byte                 `json:"-"`
	SameID                []int                  `json:"-"`
}

// Properties are a message's AMQP basic properties (the type of dlq.Record.Properties).
type Properties struct {
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

// Display is a Record as an operator sees it: credentials masked (any URL's password,
// the values of Authorization-like headers, see internal/mask), every text bounded (see
// PreviewBytes and the others) and the payload reduced to a preview. Masking is for
// display only: the Record keeps the exact bytes.
type Display struct {
	// Record is the record with Headers, ErrorMessage, ErrorStack, History and the
	// properties masked and bounded, and Payload and SameID nil.
	Record Record
	// Preview is the start of the payload, masked: its text, or base64 when the payload
	// is not UTF-8 (PreviewEncoding).
	Preview         string
	PreviewEncoding string
	// PayloadBytes is the whole payload's size; PayloadTruncated says the preview is
	// shorter.
	PayloadBytes     int
	PayloadTruncated bool
	// HeadersOmitted is how many headers beyond MaxHeadersShown are not shown.
	HeadersOmitted int
	// SameID are the positions of the other messages of the queue with the same id, when
	// the read found any (Record.SameID, see dlq.Inspector.Show).
	SameID []int
	// Download, when set, is where the exact payload can be fetched (the console's link).
	Download string
}

// Of returns r as an operator may see it (see Display).
func Of(r Record) Display {
	d := Display{PayloadBytes: len(r.Payload), SameID: r.SameID}
	d.Preview, d.PreviewEncoding, d.PayloadTruncated = Preview(r.Payload, PreviewBytes)
	out := r
	out.Payload, out.SameID = nil, nil
	out.ErrorMessage = Bounded(r.ErrorMessage, ErrorTextBytes)
	out.ErrorStack = Bounded(r.ErrorStack, ErrorTextBytes)
	out.Fingerprint = Bounded(r.Fingerprint, HeaderValueBytes)
	out.OriginalQueue = Bounded(r.OriginalQueue, HeaderValueBytes)
	out.Handler = Bounded(r.Handler, HeaderValueBytes)
	out.ErrorType = Bounded(r.ErrorType, HeaderValueBytes)
	out.Reason = Bounded(r.Reason, HeaderValueBytes)
	// What a producer said (an origin not followed, x-producer-original-queue) is shown
	// like any header value.
	out.IgnoredOrigin = Bounded(r.IgnoredOrigin, HeaderValueBytes)
	out.ProducerOriginalQueue = Bounded(r.ProducerOriginalQueue, HeaderValueBytes)
	out.FailedStage = Bounded(r.FailedStage, HeaderValueBytes)
	out.CompensationID = Bounded(r.CompensationID, HeaderValueBytes)
	out.CompensationTo = Bounded(r.CompensationTo, HeaderValueBytes)
	out.CompensationError = Bounded(r.CompensationError, ErrorTextBytes)
	out.History = make([]failure.HistoryEntry, len(r.History))
	for i, h := range r.History {
		h.Type = Bounded(h.Type, HeaderValueBytes)
		h.Message = Bounded(h.Message, HeaderValueBytes)
		out.History[i] = h
	}
	p := &out.Properties
	for _, s := range []*string{&p.CorrelationID, &p.ReplyTo, &p.MessageID, &p.Type, &p.UserID, &p.AppID, &p.ContentType, &p.ContentEncoding} {
		*s = Bounded(*s, HeaderValueBytes)
	}
	out.Headers = make(map[string]string, min(len(r.Headers), MaxHeadersShown))
	for i, k := range slices.Sorted(maps.Keys(r.Headers)) {
		if i == MaxHeadersShown {
			d.HeadersOmitted = len(r.Headers) - MaxHeadersShown
			break
		}
		out.Headers[failure.Truncate(k, HeaderValueBytes)] = failure.Truncate(mask.Header(k, r.Headers[k]), HeaderValueBytes)
	}
	d.Record = out
	return d
}

// Bounded masks s's credentials and cuts it to n bytes.
func Bounded(s string, n int) string {
	return failure.Truncate(mask.Credentials(s), n)
}

// Preview returns the first n bytes of payload's display form, masked, and whether the
// form is longer.
func Preview(payload []byte, n int) (text, encoding string, truncated bool) {
	if utf8.Valid(payload) {
		if len(payload) <= n {
			return mask.Credentials(string(payload)), "utf-8", false
		}
		end := n + maskSlack
		for end < len(payload) && !utf8.RuneStart(payload[end]) {
			end++
		}
		masked := mask.Credentials(string(payload[:min(end, len(payload))]))
		cut := min(n, len(masked))
		for cut > 0 && cut < len(masked) && !utf8.RuneStart(masked[cut]) {
			cut--
		}
		return masked[:cut], "utf-8", true
	}
	// Base64 of the first raw bytes: 3 raw bytes are 4 characters. Credentials in binary
	// are masked in its decoded form only by the download's reader.
	raw := n / 4 * 3
	if len(payload) <= raw {
		return base64.StdEncoding.EncodeToString(payload), "base64", false
	}
	return base64.StdEncoding.EncodeToString(payload[:raw]), "base64", true
}

// MarshalJSON writes the display form: the record's fields, age_seconds (null when
// unknown), failed_at and first_failure_at (RFC 3339, omitted when unknown), the payload
// preview (payload, payload_encoding), payload_bytes (the whole size), payload_truncated,
// headers_omitted, same_id_positions and masking, which says the masking is display-only.
func (d Display) MarshalJSON() ([]byte, error) {
	type plain Record
	r := d.Record
	out := struct {
		plain
		AgeSeconds       *float64   `json:"age_seconds"`
		FailedAt         *time.Time `json:"failed_at,omitempty"`
		FirstFailureAt   *time.Time `json:"first_failure_at,omitempty"`
		Payload          string     `json:"payload"`
		PayloadEncoding  string     `json:"payload_encoding"`
		PayloadBytes     int        `json:"payload_bytes"`
		PayloadTruncated bool       `json:"payload_truncated"`
		HeadersOmitted   int        `json:"headers_omitted,omitempty"`
		SameID           []int      `json:"same_id_positions,omitempty"`
		Masking          string     `json:"masking"`
		Download         string     `json:"payload_download,omitempty"`
	}{plain: plain(r), Payload: d.Preview, PayloadEncoding: d.PreviewEncoding, PayloadBytes: d.PayloadBytes,
		PayloadTruncated: d.PayloadTruncated, HeadersOmitted: d.HeadersOmitted, SameID: d.SameID, Masking: MaskingNote, Download: d.Download}
	if r.HasAge {
		s := r.Age.Seconds()
		out.AgeSeconds = &s
	}
	if !r.FailedAt.IsZero() {
		out.FailedAt = &r.FailedAt
	}
	if !r.FirstFailureAt.IsZero() {
		out.FirstFailureAt = &r.FirstFailureAt
	}
	return json.Marshal(out)
}

// Summary is one message of a list: its failure record's summary and its payload's size,
// no payload and no headers, so a list of many messages stays small whatever they hold.
type Summary struct {
	ID            string     `json:"id"`
	Position      int        `json:"position"`
	GroupID       string     `json:"group_id"`
	AgeSeconds    *float64   `json:"age_seconds"`
	FailedAt      *time.Time `json:"failed_at,omitempty"`
	ErrorType     string     `json:"error_type"`
	ErrorClass    string     `json:"error_class,omitempty"`
	Reason        string     `json:"reason,omitempty"`
	Error         string     `json:"error"`
	Retries       int        `json:"retries"`
	Replays       int        `json:"replays"`
	OriginalQueue string     `json:"original_queue"`
	Handler       string     `json:"handler,omitempty"`
	PayloadBytes  int        `json:"payload_bytes"`
	// CompensationID is the id of the compensation event published beside the dead
	// letter (see dlq.Record.CompensationID); empty when none was.
	CompensationID string `json:"compensation_id,omitempty"`
}

// SummaryOf returns r's summary: masked, its error message's first line cut to
// SummaryErrorBytes.
func SummaryOf(r Record) Summary {
	s := Summary{
		ID: r.ID, Position: r.Position, GroupID: r.GroupID,
		ErrorType: Bounded(r.ErrorType, HeaderValueBytes), ErrorClass: Bounded(r.ErrorClass, HeaderValueBytes),
		Reason: Bounded(r.Reason, HeaderValueBytes),
		Error:  ShortError(mask.Credentials(r.ErrorMessage), SummaryErrorBytes), Retries: r.Retries, Replays: r.Replays,
		OriginalQueue: Bounded(r.OriginalQueue, HeaderValueBytes), Handler: Bounded(r.Handler, HeaderValueBytes),
		PayloadBytes: len(r.Payload), CompensationID: Bounded(r.CompensationID, HeaderValueBytes),
	}
	if r.HasAge {
		a := r.Age.Seconds()
		s.AgeSeconds = &a
	}
	if !r.FailedAt.IsZero() {
		t := r.FailedAt
		s.FailedAt = &t
	}
	return s
}

// ShortError is msg's first line cut to n bytes.
func ShortError(msg string, n int) string {
	if i := strings.IndexAny(msg, "\r\n"); i >= 0 {
		msg = msg[:i]
	}
	return failure.Truncate(msg, n)
}

// Compensation says what became of a dead letter's compensation, as `sluice dlq show`
// and the console's message page say it: "event ID published to DEST", "not published:
// WHY", or "" when the handler had none. r is a display form (see Of).
func Compensation(r Record) string {
	switch {
	case r.CompensationID != "":
		to := r.CompensationTo
		if to == "" {
			to = "its destination"
		}
		return "event " + r.CompensationID + " published to " + to
	case r.CompensationError != "":
		return "not published: " + r.CompensationError
	}
	return ""
}
