package breaker

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// WithDefaults returns c with its zero fields replaced by their defaults, as New does.
func WithDefaults(c Config) Config {
	c.setDefaults()
	return c
}

const DefaultFailureRatio = defaultFailureRatio
const DefaultMinRequests = defaultMinRequests
const DefaultInterval = defaultInterval
const DefaultOpenTimeout = defaultOpenTimeout
const DefaultHalfOpenProbes = defaultHalfOpenProbes
const MaxDefaultSpread = maxDefaultSpread
const DefaultName = defaultName

// Validate is what New does with a Config.
func (c *Config) Validate() error { return c.validate() }

// The pausing API, which the router reaches through breakerhook, for the package's tests.
func (b *Breaker) Watch(f func(from, to State)) (stop func()) { return b.watch(f) }
func (b *Breaker) OpenRemaining() time.Duration               { return b.openLeft() }
func (b *Breaker) OpenTimeout() time.Duration                 { return b.cfg.OpenTimeout }
func (b *Breaker) Probes() int                                { return b.cfg.HalfOpenProbes }
func (b *Breaker) ReturningMiddleware(onReturn func(State)) message.HandlerMiddleware {
	return b.returningMiddleware(onReturn)
}
