package breaker

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
