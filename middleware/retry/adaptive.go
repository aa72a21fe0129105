package retry

import "time"

// Load is what an AdaptivePolicy sees of a dependency when a retry of one of its messages
// is planned.
type Load struct {
	Dependency string
	Queue      string
	// FailureRatio is the share of the dependency's attempts over the window that failed
	// with a retryable error; zero when there were none.
	FailureRatio float64
	// Attempts is the number of attempts behind FailureRatio.
	Attempts int64
	// Backlog is the number of messages waiting in Queue; -1 when unknown.
	Backlog int
	// InFlight is the number of attempts running against the dependency, this one
	// included.
	InFlight int
}

// Adjustment is a retry plan: how many retries a message gets and how its delays grow.
type Adjustment struct {
	// MaxRetries is the number of retries after the first attempt; a message that used
	// them goes to the dead-letter queue.
	MaxRetries int
	// DelayFactor multiplies the backoff delay (1 leaves it); the result is still capped
	// by MaxDelay.
	DelayFactor float64
	// MaxDelay caps the delay.
	MaxDelay time.Duration
}

// AdaptivePolicy adapts retries to load. Adjust receives the step's own plan (Config's
// MaxRetries and MaxDelay, DelayFactor 1) and returns the plan for this retry; it may only
// make it gentler on the dependency: fewer retries, longer or shorter delays within the
// step's MaxDelay. It is called for every retryable failure, so it must be quick.
type AdaptivePolicy interface {
	Adjust(load Load, plan Adjustment) Adjustment
}

// Thresholds and effects of DefaultAdaptive's zero fields.
const (
	// defaultElevatedPressure is the pressure from which retries are trimmed.
	defaultElevatedPressure = 0.3
	// defaultHighPressure is the pressure from which retries are cut hard (the retry
	// guide's 0.7 load threshold).
	defaultHighPressure = 0.7
	// defaultBacklogHigh is the backlog that alone counts as full pressure.
	defaultBacklogHigh = 10000
	// defaultMinAttempts is how few attempts the failure ratio needs to count.
	defaultMinAttempts = 10
)

// DefaultAdaptive is the default adaptive policy. It computes a pressure in [0, 1]: the
// larger of the dependency's failure ratio (once at least MinAttempts attempts are in the
// window) and the backlog over BacklogHigh. Then:
//
//   - pressure below Elevated (0.3): the plan is left as it is;
//   - Elevated (0.3) up to High (0.7): one retry fewer (at least 2) and delays doubled;
//   - High (0.7) and above: at most 2 retries and delays quadrupled, all within MaxDelay.
//
// Fewer retries end the wait of messages that are unlikely to succeed (they reach the
// dead-letter queue sooner, where they can be replayed), and longer delays spread the
// retries that remain, so that a dependency in trouble gets fewer calls. The zero value
// uses the numbers above.
type DefaultAdaptive struct {
	// Elevated is the pressure from which retries are trimmed. Zero means
	// 0.3.
	Elevated float64
	// High is the pressure from which retries are cut hard. Zero means
	// 0.7.
	High float64
	// BacklogHigh is the backlog that counts as full pressure. Zero means
	// 10000.
	BacklogHigh int
	// MinAttempts is the number of attempts below which the failure ratio is ignored.
	// Zero means 10.
	MinAttempts int64
}

// pressure returns the load's pressure in [0, 1] as Adjust computes it.
func (p DefaultAdaptive) pressure(load Load) float64 {
	minAttempts := p.MinAttempts
	if minAttempts == 0 {
		minAttempts = defaultMinAttempts
	}
	backlogHigh := p.BacklogHigh
	if backlogHigh == 0 {
		backlogHigh = defaultBacklogHigh
	}
	var pressure float64
	if load.Attempts >= minAttempts {
		pressure = load.FailureRatio
	}
	if load.Backlog > 0 {
		pressure = max(pressure, float64(load.Backlog)/float64(backlogHigh))
	}
	return min(pressure, 1)
}

// Adjust applies the policy described on DefaultAdaptive.
func (p DefaultAdaptive) Adjust(load Load, plan Adjustment) Adjustment {
	elevated, high := p.Elevated, p.High
	if elevated == 0 {
		elevated = defaultElevatedPressure
	}
	if high == 0 {
		high = defaultHighPressure
	}
	switch pressure := p.pressure(load); {
	case pressure >= high:
		plan.MaxRetries = min(plan.MaxRetries, 2)
		plan.DelayFactor *= 4
	case pressure >= elevated:
		plan.MaxRetries = min(plan.MaxRetries, max(plan.MaxRetries-1, 2))
		plan.DelayFactor *= 2
	}
	return plan
}
