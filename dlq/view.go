package dlq

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

// Display is a Record as an operator sees it: credentials masked (any URL's password,
// the values of Authorization-like headers, see internal/mask), every text bounded (see
// PreviewBytes and the others) and the payload reduced to a preview. Masking is for
// display only: the Record keeps the exact bytes.
type Display struct {
	// Record is the record with Headers, ErrorMessage, ErrorStack, History and the
	// properties masked and bounded, and Payload nil.
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
	// the reader found any (see Inspector.ShowAll).
	SameID []int
	// Download, when set, is where the exact payload can be fetched (the console's link).
	Download string
}

// Display returns the record as an operator may see it (see Display).
func (r Record) Display() Display {
	d := Display{PayloadBytes: len(r.Payload), SameID: r.sameID}
	d.Preview, d.PreviewEncoding, d.PayloadTruncated = preview(r.Payload, PreviewBytes)
	out := r
	out.Payload, out.sameID = nil, nil
	out.ErrorMessage = bounded(r.ErrorMessage, ErrorTextBytes)
	out.ErrorStack = bounded(r.ErrorStack, ErrorTextBytes)
	out.Fingerprint = bounded(r.Fingerprint, HeaderValueBytes)
	out.OriginalQueue = bounded(r.OriginalQueue, HeaderValueBytes)
	out.Handler = bounded(r.Handler, HeaderValueBytes)
	out.ErrorType = bounded(r.ErrorType, HeaderValueBytes)
	out.Reason = bounded(r.Reason, HeaderValueBytes)
	// What a producer said (an origin not followed, x-producer-original-queue) is shown
	// like any header value.
	out.IgnoredOrigin = bounded(r.IgnoredOrigin, HeaderValueBytes)
	out.ProducerOriginalQueue = bounded(r.ProducerOriginalQueue, HeaderValueBytes)
	out.FailedStage = bounded(r.FailedStage, HeaderValueBytes)
	out.History = make([]failure.HistoryEntry, len(r.History))
	for i, h := range r.History {
		h.Type = bounded(h.Type, HeaderValueBytes)
		h.Message = bounded(h.Message, HeaderValueBytes)
		out.History[i] = h
	}
	p := &out.Properties
	for _, s := range []*string{&p.CorrelationID, &p.ReplyTo, &p.MessageID, &p.Type, &p.UserID, &p.AppID, &p.ContentType, &p.ContentEncoding} {
		*s = bounded(*s, HeaderValueBytes)
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

// bounded masks s's credentials and cuts it to n bytes.
func bounded(s string, n int) string {
	return failure.Truncate(mask.Credentials(s), n)
}

// preview returns the first n bytes of payload's display form, masked, and whether the
// form is longer.
func preview(payload []byte, n int) (text, encoding string, truncated bool) {
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
	type plain Record // drops Record's MarshalJSON, keeps the field tags
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

// MaskingNote says what the display masks, and that the message itself is unchanged.
const MaskingNote = "display only: passwords in URLs and Authorization-like header values are shown as xxxxx; the message itself (replay, download, --payload-file) keeps the exact bytes"

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
}

// Summary returns the record's summary: masked, its error message's first line cut to
// SummaryErrorBytes.
func (r Record) Summary() Summary {
	s := Summary{
		ID: r.ID, Position: r.Position, GroupID: r.GroupID,
		ErrorType: bounded(r.ErrorType, HeaderValueBytes), ErrorClass: bounded(r.ErrorClass, HeaderValueBytes),
		Reason: bounded(r.Reason, HeaderValueBytes),
		Error:  shortError(mask.Credentials(r.ErrorMessage), SummaryErrorBytes), Retries: r.Retries, Replays: r.Replays,
		OriginalQueue: bounded(r.OriginalQueue, HeaderValueBytes), Handler: bounded(r.Handler, HeaderValueBytes),
		PayloadBytes: len(r.Payload),
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

// shortError is msg's first line cut to n bytes.
func shortError(msg string, n int) string {
	if i := strings.IndexAny(msg, "\r\n"); i >= 0 {
		msg = msg[:i]
	}
	return failure.Truncate(msg, n)
}
