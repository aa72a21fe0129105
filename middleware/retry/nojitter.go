package retry

// NoJitter, as Config.Jitter, turns the backoff's randomization off: every delay is exactly
// the computed backoff. Config.Jitter's zero value cannot say this, since zero means the
// default of 0.1; any negative value means none, and NoJitter names it.
const NoJitter = -1.0
