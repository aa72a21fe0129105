// Package dlq reads, replays and purges the dead-letter queue Q.dlq of any queue Q that uses
// sluice's topology (see broker/amqp). It talks to RabbitMQ with a plain amqp091-go
// connection, so the operator CLI (cmd/sluice dlq), tests and demos share one implementation.
//
// # Reading never consumes
//
// Inspector.List, Show and Stats and a dry-run Replayer take messages with basic.get
// without acknowledging them, all on one channel, and then close that channel. RabbitMQ
// gives every unacknowledged message of a closed channel back to its queue, so reading
// leaves the DLQ as it was: same messages, same order. A classic queue puts each message
// back in its original position; a quorum queue (RabbitMQ 3.10, measured) appends returned
// messages at its tail, so a read always takes every message the DLQ held when it started,
// even when it needs only the first (List with a limit, Show), and gives them all back in
// order. The cost is one basic.get per message in the DLQ. Messages that arrive in a quorum
// DLQ while it is read, or a read cut short (ctx cancelled), can end up ahead of older ones.
//
// While a read runs, the messages it holds are unacknowledged, not ready: a concurrent
// count of ready messages is lower for that time. On quorum queues RabbitMQ counts each
// return as a delivery attempt (x-delivery-count grows by one per read); sluice's DLQs have
// no delivery limit, so that count is informational, but a quorum DLQ with a delivery limit
// (declared by hand, or a RabbitMQ version with a default limit) would drop messages that
// are read often.
//
// # Message ids
//
// A record's id is the message's Watermill id (header _watermill_message_uuid), else its
// AMQP message-id, else "sha256:" and the first 16 hex digits of the payload's SHA-256, so
// a message without any id (dead-lettered by RabbitMQ from a foreign producer) still has
// one that is the same on every read.
//
// # Replay is crash safe
//
// Replayer.Replay sends selected messages back to their original queue (header
// x-original-queue, else Q) through the default exchange, with the retry state reset: the
// retry and failure-record headers are removed, x-replay-count is incremented, and the
// message id, payload, AMQP properties, trace context (traceparent, tracestate) and every
// other header are kept. Each message is moved in its own AMQP transaction on one channel:
//
//	tx.select; basic.get from Q.dlq (no ack)
//	if it matches: check the destination queue exists (passive declare, on a second channel);
//	               publish (mandatory) to it; basic.ack the DLQ copy; tx.commit
//	else:          leave it unacknowledged
//
// The publish and the removal of the DLQ copy are committed together, so a process killed
// at any point (SIGKILL included) neither loses a message nor leaves it both replayed and in
// the DLQ: an uncommitted transaction is discarded with the connection, and the messages the
// channel held unacknowledged go back to the DLQ in their order.
//
// Why the destination check comes before the publish: inside a transaction RabbitMQ sends
// the basic.return of an unroutable mandatory publish only when the transaction commits
// (measured on RabbitMQ 3.10), that is, after the acknowledgement of the DLQ copy has been
// committed too; a round trip before tx.commit cannot see it. So Replay checks that the
// destination exists just before each publish, and if the queue vanishes in between and the
// publish is returned at commit, Replay publishes the untouched DLQ copy back to Q.dlq in a
// second transaction and reports the message as not replayed. Only a process killed in that
// window, while the destination is being deleted, could lose that one message.
//
// A run reads at most the number of messages the DLQ held when it started, so a replayed
// message that fails again and comes back to the DLQ (at its tail) during the run is left
// there rather than replayed in a loop.
package dlq
