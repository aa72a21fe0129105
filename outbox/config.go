package outbox

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluice-go/sluice/internal/outboxstore"

	"github.com/sluice-go/sluice/broker/amqp"
)

// Errors of the outbox.
var (
	// ErrFull means the outbox holds Config.MaxMessages messages or Config.MaxBytes bytes
	// already: the message was neither confirmed by the broker nor kept.
	ErrFull = outboxstore.ErrFull
	// ErrClosed is returned by a closed publisher.
	ErrClosed = outboxstore.ErrClosed
)

// errNoDir refuses a Config without Dir: a program fixes its configuration, it does not
// branch on it.
var errNoDir = errors.New("outbox: no directory configured")

// Config configures a Publisher. Only Dir is required.
type Config struct {
	// Dir is the directory of the outbox file (sluice-outbox.db), created if missing. One
	// producer process per directory: a second one waits for the file lock, then fails.
	Dir string
	// DirectTimeout is how long a publish waits for the broker's confirm before it keeps
	// the message in the outbox instead. Zero means 2s; it bounds a caller's wait when
	// the broker goes away (later publishes go to the outbox directly).
	DirectTimeout time.Duration
	// MaxMessages caps the outbox's entries. Zero means 1,000,000.
	MaxMessages int
	// MaxBytes caps the outbox's encoded size in bytes. Zero means 1 GiB.
	MaxBytes int64
	// ForwardBatch is how many entries the forwarder publishes at once, confirms
	// pipelined. Zero means 200.
	ForwardBatch int
	// ForwardTimeout bounds one forwarded batch, confirms included. Zero means 10s.
	ForwardTimeout time.Duration
	// RetryMaxInterval caps the forwarder's wait between failed attempts. Zero means 2s.
	RetryMaxInterval time.Duration
	// Permanent tells an error that keeping the message cannot cure: Publish returns it
	// to the caller, and the forwarder sets such an entry aside as rejected. Nil means
	// amqp.ErrUnroutable (no queue bound: publishing again is returned again).
	Permanent func(error) bool
	// Logger receives the outbox's state changes. Nil means slog.Default().
	Logger *slog.Logger
}

// validate fills in the defaults and checks the values.
func (c *Config) validate() error {
	if c.Dir == "" {
		return errNoDir
	}
	if c.DirectTimeout == 0 {
		c.DirectTimeout = 2 * time.Second
	}
	if c.MaxMessages == 0 {
		c.MaxMessages = 1_000_000
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 1 << 30
	}
	if c.ForwardBatch == 0 {
		c.ForwardBatch = 200
	}
	if c.ForwardTimeout == 0 {
		c.ForwardTimeout = 10 * time.Second
	}
	if c.RetryMaxInterval == 0 {
		c.RetryMaxInterval = 2 * time.Second
	}
	for name, v := range map[string]int64{
		"DirectTimeout": int64(c.DirectTimeout), "MaxMessages": int64(c.MaxMessages),
		"MaxBytes": c.MaxBytes, "ForwardBatch": int64(c.ForwardBatch),
		"ForwardTimeout": int64(c.ForwardTimeout), "RetryMaxInterval": int64(c.RetryMaxInterval),
	} {
		if v < 0 {
			return fmt.Errorf("outbox: %s is negative (%d)", name, v)
		}
	}
	if c.Permanent == nil {
		c.Permanent = func(err error) bool { return errors.Is(err, amqp.ErrUnroutable) }
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}
