package headers

// Header names sluice writes that are its own bookkeeping rather than what a handler reads;
// moved from package sluice (their Header-prefixed names there). Values unchanged.
const (
	// FirstFailureTime is the RFC 3339 time of the first failed attempt.
	FirstFailureTime = "x-first-failure-time"
	// LastFailureTime is the RFC 3339 time of the latest failed attempt.
	LastFailureTime = "x-last-failure-time"
	// DeferCount is how many times the message was deferred (attempts not used).
	DeferCount = "x-defer-count"
	// FirstDeferTime is the RFC 3339 time of the first deferral.
	FirstDeferTime = "x-first-defer-time"
	// Handler, FailedAt, FailedHost, FailedPID and ErrorClass are the failure record's
	// "where and how" fields (see package poison), beside sluice.HeaderErrorType & co.
	Handler    = "x-handler"
	FailedAt   = "x-failed-at"
	FailedHost = "x-failed-host"
	FailedPID  = "x-failed-pid"
	ErrorClass = "x-error-class"
	// DeadLetterReason says why sluice stopped trying (decide.ReasonOf:
	// permanent, retries_exhausted, max_age, retry_unlikely, ...), beside the error type
	// that says what failed.
	DeadLetterReason = "x-dead-letter-reason"
	// ReplayCount counts replays from the dead-letter queue.
	ReplayCount = "x-replay-count"
	// CompensationID and CompensationTo say, on a dead letter, that the handler's
	// compensation event was published beside it: its id and where it went;
	// CompensationError that it was not, and why. CompensationOf names, on the event, the
	// message it compensates.
	CompensationID    = "x-compensation-id"
	CompensationTo    = "x-compensation-to"
	CompensationError = "x-compensation-error"
	CompensationOf    = "x-compensation-of"
	// WatermillCorrelationID is Watermill's correlation id metadata
	// (middleware.CorrelationIDMetadataKey), carried onto a compensation event.
	WatermillCorrelationID = "correlation_id"
	// TraceParent and TraceState carry W3C trace context.
	TraceParent = "traceparent"
	TraceState  = "tracestate"
)

// The marshaler's bookkeeping (package broker/amqp; see its Marshaler): moved from there
// (MetadataHeaderPrefix, HeaderDroppedHeaders, MetadataHeaderTypes, UUIDHeader), so that
// all four live here. Values unchanged.
const (
	// MetadataPrefix keeps a producer's header whose name is taken by one of the property
	// metadata keys (a header called "content-type", say, beside the content-type property)
	// or itself starts with this prefix: it is metadata MetadataPrefix+name, and Marshal
	// publishes that key as the header name again (see HeaderName).
	MetadataPrefix = "amqp-header:"
	// Dropped lists, comma-separated, the headers and properties Marshal had to leave out
	// because AMQP cannot carry them.
	Dropped = "x-dropped-headers"
	// HeaderTypes is the metadata key that records the AMQP type of every header that was
	// not a string, as a JSON object from the header's metadata key to type name, so
	// Marshal can restore it. It is filled on consume and never published.
	HeaderTypes = "sluice-header-types"
	// UUID is Watermill's message id header (watermill-amqp's
	// DefaultMessageUUIDHeaderKey), kept for interoperability. Spelled out rather than
	// imported: importing watermill-amqp here compiled amqp091 into every broker-neutral
	// package; broker/amqp's tests check that the two agree.
	UUID = "_watermill_message_uuid"
)
