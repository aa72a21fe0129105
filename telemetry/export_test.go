package telemetry

// What the package's tests read of the depth watcher.
var (
	ErrNoDepthSource = errNoDepthSource
	ErrNoDepthQueues = errNoDepthQueues
	ErrDepthInterval = errDepthInterval
	ErrManagementURL = errManagementURL
)

// DefaultDepthInterval is the interval of a DepthConfig without one.
const DefaultDepthInterval = defaultDepthInterval

// WatchDepthRounds is WatchDepth that also returns how many rounds of reads have
// completed: two more than a test saw before a change means the gauges reflect it.
func WatchDepthRounds(cfg DepthConfig) (stop func() error, rounds func() int64, err error) {
	w, err := watchDepth(cfg)
	if err != nil {
		return nil, nil, err
	}
	return w.close, w.roundsDone, nil
}

// Validate is DepthConfig's validate, which applies the defaults.
func (c *DepthConfig) Validate() error { return c.validate() }
