package breaker

// WithDefaults returns c with its zero fields replaced by their defaults, as New does.
func WithDefaults(c Config) Config {
	c.setDefaults()
	return c
}
