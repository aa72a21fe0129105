package memory

// TopicMatch is topicMatch, for the table test of the topic rules.
var TopicMatch = topicMatch

// The refusals of a publish the broker cannot route, for their tests.
var (
	ErrNoExchange     = errNoExchange
	ErrNotPartitioned = errNotPartitioned
	ErrPartitioned    = errPartitioned
)
