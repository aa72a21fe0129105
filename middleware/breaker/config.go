package breaker

import (
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Defaults applied to a zero Config field.
const (
	// defaultFailureRatio is the trip ratio when neither ConsecutiveFailures nor
	// FailureRatio is set.
	defaultFailureRatio = 0.5
	// defaultMinRequests is the minimum number of completed calls in the window before the
	// failure ratio is considered.
	defaultMinRequests = 20
	// defaultInterval is the rolling window over which calls are counted in the closed state.
	defaultInterval = 60 * time.Second
	// defaultOpenTimeout is how long the breaker stays open before it lets probes through.
	defaultOpenTimeout = 30 * time.Second
	// defaultHalfOpenProbes is how many calls are let through in the half-open state.
	defaultHalfOpenProbes = 1
	// maxDefaultSpread caps the default Spread (a tenth of OpenTimeout).
	maxDefaultSpread = time.Second
	// defaultName names the breaker of a message whose context carries no handler name
	// when Config.Name is empty (a handler called outside a Watermill router).
	defaultName = "default"
)

// windowBuckets is how many buckets the rolling window is cut into: the window slides in
// steps of Interval/windowBuckets, so old calls age out gradually instead of all at once.
const windowBuckets = 10

// Config configures a Registry and every Breaker it hands out. The zero value is usable:
// it trips when at least 20 calls completed in the window and
// half of them failed, and stays open for 30s.
//
// Whatever the trip, a message counts as a failure once per window: its retries and
// redeliveries failing again are left out of the counts, so one poison message, however
// often it is retried, never opens a breaker; failures of distinct messages do.
type Config struct {
	// Name is the dependency name Registry.Middleware and Registry.NewMiddleware("") use.
	// Empty means the handler's name, read from each message's context
	// (message.HandlerNameFromCtx), or "default" when the context has none.
	Name string

	// ConsecutiveFailures trips the breaker after this many consecutive failures in the
	// closed state (of distinct messages: see Config). Zero means no consecutive-failure
	// trip.
	ConsecutiveFailures int

	// FailureRatio, in (0, 1], trips the breaker when failures/(failures+successes) over
	// the window reaches it and at least MinRequests calls have completed in the window.
	// Zero means 0.5 when ConsecutiveFailures is zero too, and no ratio
	// trip when ConsecutiveFailures is set.
	FailureRatio float64

	// MinRequests is the number of completed calls in the window below which FailureRatio
	// is not considered. Zero means 20. Ignored without a ratio trip.
	MinRequests int

	// Interval is the rolling window over which the closed state counts calls (for both
	// trips: failures older than the window no longer count). Zero means 1m.
	Interval time.Duration

	// OpenTimeout is how long the breaker stays open before it lets HalfOpenProbes calls
	// through. Zero means 30s.
	OpenTimeout time.Duration

	// HalfOpenProbes is how many calls the half-open breaker lets through; the breaker
	// closes when all of them succeed and re-opens as soon as one fails. Zero means
	// 1.
	HalfOpenProbes int

	// Spread is the upper bound of a random delay added to each deferral, so messages
	// deferred by an open breaker do not all come back at the same instant. Zero means a
	// tenth of OpenTimeout, at most 1s; a negative value means no spread.
	Spread time.Duration

	// Fallback, when set, is called instead of deferring a message the breaker rejects;
	// err wraps ErrOpen. Its result is the middleware's result.
	Fallback func(msg *message.Message, err error) ([]*message.Message, error)

	// Logger receives state changes (warn on opening, info otherwise) and deferrals
	// (debug). Nil means slog.Default().
	Logger *slog.Logger

	// OnStateChange, when set, is called once for each state change of any breaker of the
	// registry, in order, outside the breaker's lock: it may call Registry.State. It runs
	// on the goroutine of a call that observed the change, so it should be quick. An open
	// breaker turns half-open lazily: when a message or a State call finds its OpenTimeout
	// passed, and the hook is called then.
	OnStateChange func(name string, from, to State)
}

// validate reports the first invalid field of c, for New. Zero values are valid.
func (c *Config) validate() error {
	if c.ConsecutiveFailures < 0 || int64(c.ConsecutiveFailures) > math.MaxUint32 {
		return fmt.Errorf("breaker: ConsecutiveFailures %d out of range [0, %d]", c.ConsecutiveFailures, uint32(math.MaxUint32))
	}
	if math.IsNaN(c.FailureRatio) || c.FailureRatio < 0 || c.FailureRatio > 1 {
		return fmt.Errorf("breaker: FailureRatio %v out of range [0, 1]", c.FailureRatio)
	}
	if c.MinRequests < 0 || int64(c.MinRequests) > math.MaxUint32 {
		return fmt.Errorf("breaker: MinRequests %d out of range [0, %d]", c.MinRequests, uint32(math.MaxUint32))
	}
	if c.Interval < 0 {
		return fmt.Errorf("breaker: Interval %s is negative", c.Interval)
	}
	if c.OpenTimeout < 0 {
		return fmt.Errorf("breaker: OpenTimeout %s is negative", c.OpenTimeout)
	}
	if c.HalfOpenProbes < 0 || int64(c.HalfOpenProbes) > math.MaxUint32 {
		return fmt.Errorf("breaker: HalfOpenProbes %d out of range [0, %d]", c.HalfOpenProbes, uint32(math.MaxUint32))
	}
	return nil
}

// setDefaults replaces zero fields by their documented defaults.
func (c *Config) setDefaults() {
	if c.ConsecutiveFailures == 0 && c.FailureRatio == 0 {
		c.FailureRatio = defaultFailureRatio
	}
	if c.FailureRatio > 0 && c.MinRequests == 0 {
		c.MinRequests = defaultMinRequests
	}
	if c.Interval == 0 {
		c.Interval = defaultInterval
	}
	if c.OpenTimeout == 0 {
		c.OpenTimeout = defaultOpenTimeout
	}
	if c.HalfOpenProbes == 0 {
		c.HalfOpenProbes = defaultHalfOpenProbes
	}
	switch {
	case c.Spread == 0:
		c.Spread = min(c.OpenTimeout/10, maxDefaultSpread)
	case c.Spread < 0:
		c.Spread = 0
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}
