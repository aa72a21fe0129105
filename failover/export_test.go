package failover

// ErrNotConnected is errClusterNotConnected, which a Cluster's publisher returns before the
// cluster's first connection.
var ErrNotConnected = errClusterNotConnected

// Validate is what NewPublisher does with its Config: defaults filled in, negative
// durations refused.
func Validate(c *Config) error { return c.validate() }

// Counts returns how many messages each cluster confirmed.
func Counts(p *Publisher) (primary, secondary uint64) { return p.counts() }
