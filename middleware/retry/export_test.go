package retry

// Aliases for the package's external tests.
const DefaultBudgetRatio = defaultBudgetRatio
const DefaultBudgetWindow = defaultBudgetWindow
const DefaultMinRetriesPerSecond = defaultMinRetriesPerSecond

// Explored is explored, for the learned policy's tests.
var Explored = explored

// New's refusals, for the tests of a Config missing a capability.
var (
	ErrNoDelayer    = errNoDelayer
	ErrNoDeadLetter = errNoDeadLetter
)

// AdaptiveFunc is an AdaptivePolicy written as a function, for the tests' policies.
type AdaptiveFunc func(load Load, plan Adjustment) Adjustment

func (f AdaptiveFunc) Adjust(load Load, plan Adjustment) Adjustment { return f(load, plan) }
