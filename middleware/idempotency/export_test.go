package idempotency

// Aliases for the package's external tests.
const DefaultInFlightDeferral = defaultInFlightDeferral
const MaxMaxKeys = maxMaxKeys
const ErrorTypeKey = errorTypeKey

var NewStore = newStore

type Status = keyStatus

const (
	Acquired = keyAcquired
	Done     = keyDone
	InFlight = keyInFlight
)
