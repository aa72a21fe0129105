package sluice

// QueueDepth is what a broker says of one queue: its messages and its consumers. Both of
// sluice's brokers (broker/amqp and the embedded one) return it from
// QueueDepth(ctx, queue) (QueueDepth, error), the method telemetry's depth watcher and
// the retry step's adaptive policy read; a queue that does not exist is
// ErrQueueNotFound.
type QueueDepth struct {
	// Ready is the number of messages waiting for a consumer.
	Ready int64
	// Unacked is the number delivered and not yet acknowledged, valid if UnackedKnown.
	Unacked int64
	// UnackedKnown is false for a source that cannot see unacknowledged messages (AMQP's
	// passive queue.declare reports ready messages and consumers only).
	UnackedKnown bool
	// Consumers is the number of consumers.
	Consumers int64
}
