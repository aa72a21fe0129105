package dlqwire

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/sluice-go/sluice"
	hdr "github.com/sluice-go/sluice/internal/headers"
)

// ErrEditRefused: see dlq.ErrEditRefused.
var ErrEditRefused = errors.New("dlq: edit refused")

// Limits of an edit. RabbitMQ accepts larger messages; an edit is an operator's hand
// correction of one message, and a larger payload is far more likely a mistake (a wrong
// file) than a fix. ErrEditRefused's text names the limit an edit is past.
const (
	// MaxEditPayload is the largest payload an edit publishes: 1 MiB.
	MaxEditPayload = 1 << 20
	// MaxEditHeaderValue is the longest header value an edit sets: 4 KiB.
	MaxEditHeaderValue = 4 << 10
	// maxHeaderName is AMQP's limit on a table key (a short string).
	maxHeaderName = 255
)

// ResetOnReplay are the headers a replay removes: the retry state and the failure record,
// so the message starts over with a full set of retries. x-original-queue stays (for the
// record; a replay goes to Q whatever it says), and so do the first failure time and the
// history, to which the replay adds an entry.
var ResetOnReplay = func() map[string]bool {
	set := hdr.Set([][]string{hdr.RetryState, hdr.FailureRecord}, hdr.ArchivedAt)
	delete(set, hdr.FirstFailureTime)
	delete(set, sluice.HeaderRetryHistory)
	return set
}()

// CheckEdit reports an edit (dlq.Edit's ID, Payload, SetHeaders and UnsetHeaders) that
// changes nothing, a payload or header past the limits, or a header sluice owns (the retry
// state, the failure record, the message id, the trace context, RabbitMQ's x-death): an
// edit corrects the message, never its history. Every error matches ErrEditRefused.
// Operator.Edit checks it first; the console checks it to preview an edit.
func CheckEdit(id string, payload []byte, set map[string]string, unset []string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: no message id", ErrEditRefused)
	case payload == nil && len(set) == 0 && len(unset) == 0:
		return fmt.Errorf("%w: nothing to change: give a payload or a header to set or unset", ErrEditRefused)
	case len(payload) > MaxEditPayload:
		return fmt.Errorf("%w: payload of %d bytes is over the %d-byte limit", ErrEditRefused, len(payload), MaxEditPayload)
	}
	for k, v := range set {
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
	for _, k := range unset {
		if err := checkEditHeader(k); err != nil {
			return err
		}
		if _, both := set[k]; both {
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
	if k == hdr.UUID || k == sluice.HeaderOriginalQueue || k == hdr.TraceParent || k == hdr.TraceState ||
		k == hdr.ReplayCount || k == hdr.ReplayedAt || k == hdr.ArchivedAt || k == hdr.Dropped ||
		ResetOnReplay[k] || hdr.BrokerOwned(key) || hdr.BrokerOwned(k) { // CC and BCC are upper case
		return true
	}
	for _, p := range []string{"x-sluice-", "x-producer-", "sluice-", "x-retry-", "x-error-", "x-failed-"} {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}
