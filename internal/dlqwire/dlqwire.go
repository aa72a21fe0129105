// Package dlqwire holds what package dlq and the sluice CLI share below dlq's API: the
// connection (Dial), error masking, a delivery's id and payload text, the archive's
// default retention, an edit's limits and checks, and the sentinel errors dlq re-exports.
package dlqwire

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice"
	hdr "github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/mask"
)

// Errors dlq re-exports under the same names (see package dlq).
var (
	// ErrQueueNotFound is sluice.ErrQueueNotFound, named here for the masked error's Is.
	ErrQueueNotFound = sluice.ErrQueueNotFound
	// ErrMessageNotFound: see dlq.ErrMessageNotFound.
	ErrMessageNotFound = errors.New("message not found")
	// ErrDestinationNotFound: see dlq.ErrDestinationNotFound.
	ErrDestinationNotFound = errors.New("destination queue not found")
	// ErrNoSelector: see dlq.ErrNoSelector.
	ErrNoSelector = errors.New("no selector: give ids, an error type, an age or All")
)

// DialTimeout bounds the TCP and AMQP handshake of Dial.
const DialTimeout = 10 * time.Second

// Dial connects to the first reachable of urls. Errors name the URL with its password
// masked (internal/mask.URL) and never contain the password.
func Dial(urls ...string) (*amqp.Connection, error) {
	if len(urls) == 0 {
		return nil, errors.New("dlq: no RabbitMQ URL given")
	}
	var errs []error
	for _, u := range urls {
		cfg := amqp.Config{
			Dial:       amqp.DefaultDial(DialTimeout),
			Heartbeat:  10 * time.Second,
			Properties: amqp.Table{"connection_name": "sluice dlq"},
		}
		conn, err := amqp.DialConfig(u, cfg)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, MaskError(fmt.Errorf("connect to RabbitMQ at %s: %w", mask.URL(u), err), urls...))
	}
	return nil, errors.Join(errs...)
}

// MaskError returns err with every password of urls, and every URL, masked in its text.
// An error whose text holds no secret is returned as it is, so errors.Is still works; a
// masked one keeps the sentinel errors of this package it wrapped.
func MaskError(err error, urls ...string) error {
	if err == nil {
		return nil
	}
	text := err.Error()
	masked := mask.Text(text, urls...)
	if masked == text {
		return err
	}
	return &maskedError{text: masked, err: err}
}

// maskedError is an error whose text had a secret removed. It unwraps only to the
// sentinels of this package, never to the original (whose text holds the secret).
type maskedError struct {
	text string
	err  error
}

func (e *maskedError) Error() string { return e.text }

func (e *maskedError) Is(target error) bool {
	switch target {
	case ErrQueueNotFound, ErrMessageNotFound, ErrDestinationNotFound, ErrNoSelector:
		return errors.Is(e.err, target)
	}
	return false
}

// PayloadText returns payload as text and its encoding: the bytes themselves ("utf-8")
// when they are valid UTF-8, else base64 ("base64").
func PayloadText(payload []byte) (text, encoding string) {
	if utf8.Valid(payload) {
		return string(payload), "utf-8"
	}
	return base64.StdEncoding.EncodeToString(payload), "base64"
}

// MessageID returns the id of a delivery as Record.ID defines it.
func MessageID(d amqp.Delivery) string {
	if v, ok := d.Headers[hdr.UUID].(string); ok && v != "" {
		return v
	}
	if d.MessageId != "" {
		return d.MessageId
	}
	sum := sha256.Sum256(d.Body)
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// DefaultRetention is how long Q.dlq.archive keeps an archived message when Archive
// creates it: x-message-ttl of 14 days, counted from the archiving. An archive that exists
// is used as it is; a RabbitMQ policy with message-ttl on it overrides the argument when
// it is lower (RabbitMQ applies the lower of the two).
const DefaultRetention = 14 * 24 * time.Hour
