package outbox

// Validate is what New does with its Config: defaults filled in, values checked.
func Validate(c *Config) error { return c.validate() }
