package idempotency

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Defaults applied to a zero Config field.
const (
	// defaultTTL is how long a completed key is remembered.
	defaultTTL = 24 * time.Hour
	// defaultMaxKeys is the capacity of the store: at about 40 bytes a key, some 40 MB.
	defaultMaxKeys = 1_000_000
	// defaultLease is how long an attempt holds its key before another may take it.
	defaultLease = 2 * time.Minute
	// defaultInFlightDeferral is how long a duplicate of a key in flight is deferred.
	defaultInFlightDeferral = time.Second
)

// maxMaxKeys is the largest accepted Config.MaxKeys; far beyond what fits in memory anyway,
// it keeps the store's internal 32-bit positions unambiguous.
const maxMaxKeys = 1 << 30

// minLease and minTTL keep expiry meaningful at the store's nanosecond resolution, where the
// lowest bit of a timestamp carries the record's state.
const (
	minLease = time.Millisecond
	minTTL   = time.Millisecond
)

// maxDuration bounds TTL and Lease so that now plus either stays within int64 nanoseconds.
const maxDuration = 100 * 365 * 24 * time.Hour

// ErrInvalidConfig is wrapped by every error New returns for an invalid Config.
var ErrInvalidConfig = errors.New("idempotency: invalid config")

// Config configures the idempotency step and its store. Every zero value means the default
// stated on the field.
type Config struct {
	// KeyFunc derives a message's key when it has no idempotency-key metadata (for the
	// payment example, the payment_id in the JSON body), for handlers without a key
	// function of their own (the argument of Guard.NewMiddleware, which the router fills from
	// router.WithIdempotencyKey). An error from it is bad input: the
	// message fails with sluice.Permanent and goes to the dead-letter queue. An empty key
	// with a nil error means "no key of its own": the message id is used. Nil: the message
	// id is the key of every message without idempotency-key metadata.
	KeyFunc func(*message.Message) (string, error)

	// TTL is how long a completed key is remembered, so the window in which a duplicate is
	// recognized. Zero: 24h.
	TTL time.Duration

	// MaxKeys bounds the keys held (completed and in flight). When it is reached, the
	// oldest key is forgotten first, even inside its TTL. The bound is split evenly over
	// the store's shards (up to 64) and each evicts its own oldest, so eviction starts a
	// little before MaxKeys keys are held (at 1,000,000 random keys, after about 99.7%).
	// Zero: 1,000,000.
	MaxKeys int

	// Lease is how long an attempt holds its key. If the holder dies (its process is
	// killed), the key can be taken by another attempt once the lease has run out. An
	// attempt the stack abandoned at its handler timeout (router.Config.HandlerTimeout) is
	// not dead, its goroutine may still do the work: it keeps its key until its handler
	// returns, whatever the lease, and a message of that key meanwhile fails with
	// ErrStillRunning. Lease must exceed the handler timeout plus its grace, otherwise a slow
	// but live attempt loses its key and a duplicate may run beside it. Zero: 2m.
	Lease time.Duration

	// InFlightDeferral is how long a duplicate of a key in flight is deferred broker-side,
	// or the rest of the holder's lease if that is shorter. Zero: 1s.
	InFlightDeferral time.Duration

	// SnapshotPath, when set, is a file the completed keys are written to on Close
	// (atomically) and read from at New. A missing file is not an error. Empty: no snapshot.
	SnapshotPath string

	// SnapshotInterval, with SnapshotPath, also writes the snapshot this often while the
	// Guard runs, so that a crash (SIGKILL, power loss) forgets only the completions of the
	// last interval instead of everything since the start. Zero: only on Close. One
	// goroutine does it; Guard.Close stops it.
	SnapshotInterval time.Duration

	// OnDuplicate, when set, is called for every duplicate of a completed key, after it
	// was counted and before it is acknowledged. key is the key as derived, before scoping.
	// It runs on the handler's goroutine and must be quick.
	OnDuplicate func(msg *message.Message, key string)

	// DisableJournal turns the journal off (see Guard.Journaled): the stack then keeps
	// keys in this process's memory only, and a crash (SIGKILL, OOM kill, lost node) forgets
	// every key done since the last snapshot, as does another instance, which never saw
	// them; duplicates arriving after that run again. Zero: the step journals its done keys
	// whenever the stack's broker keeps journals (RabbitMQ streams).
	DisableJournal bool

	// Logger receives journal failures. Nil: slog.Default().
	Logger *slog.Logger

	// Now is the clock, for tests of TTL and lease expiry. Nil: time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.TTL == 0 {
		c.TTL = defaultTTL
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = defaultMaxKeys
	}
	if c.Lease == 0 {
		c.Lease = defaultLease
	}
	if c.InFlightDeferral == 0 {
		c.InFlightDeferral = defaultInFlightDeferral
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// validate reports the first invalid field after defaults are applied to a copy of c, so a
// zero Config is valid. New is the one place a Config is checked.
func (c Config) validate() error {
	c.setDefaults()
	switch {
	case c.TTL < minTTL:
		return fmt.Errorf("%w: TTL %s is below %s", ErrInvalidConfig, c.TTL, minTTL)
	case c.TTL > maxDuration:
		return fmt.Errorf("%w: TTL %s is above %s", ErrInvalidConfig, c.TTL, maxDuration)
	case c.MaxKeys < 1:
		return fmt.Errorf("%w: MaxKeys %d is below 1", ErrInvalidConfig, c.MaxKeys)
	case c.MaxKeys > maxMaxKeys:
		return fmt.Errorf("%w: MaxKeys %d is above %d", ErrInvalidConfig, c.MaxKeys, maxMaxKeys)
	case c.Lease < minLease:
		return fmt.Errorf("%w: Lease %s is below %s", ErrInvalidConfig, c.Lease, minLease)
	case c.Lease > maxDuration:
		return fmt.Errorf("%w: Lease %s is above %s", ErrInvalidConfig, c.Lease, maxDuration)
	case c.InFlightDeferral < 0:
		return fmt.Errorf("%w: InFlightDeferral %s is negative", ErrInvalidConfig, c.InFlightDeferral)
	}
	return nil
}
