// Package dlq is the Go API of sluice's failure operations on the dead-letter queue Q.dlq
// of any queue Q that uses sluice's topology (see broker/amqp), and on its archive
// Q.dlq.archive: read (Inspector: Messages, Show, Stats, Groups), replay, archive, edit
// and purge (Operator), with progress reported to a callback. Inspector and Operator are
// plain values over a plain amqp091-go connection, so the operator CLI (cmd/sluice dlq),
// the console, tests and demos share one implementation.
//
//	in := dlq.Inspector{Conn: conn}
//	groups, _ := in.Groups(ctx, "payments")             // largest first
//	op := dlq.Operator{Conn: conn}
//	op.Progress = func(p dlq.Progress) { ... }          // at most every 200ms, and at the end
//	res, err := op.Replay(ctx, "payments", dlq.Selector{Group: groups[0].ID}, dlq.Options{})
//	res, err = op.Archive(ctx, "payments", dlq.Selector{ErrorType: "gateway_down"}, dlq.Options{})
//
// # Failure groups
//
// A dead letter's group is its handler, error type and a fingerprint of where it failed:
// a panic's top stack frames, else its error message with numbers, ids, UUIDs and hex
// stripped (see fingerprint.go). Groups are what an operator replays, archives or purges
// (Selector.Group). Records of older sluice versions (a panic's stack inside
// x-error-message) and newer ones (the value only, the stack in x-error-stack) group alike.
//
// # Reading never consumes, and is streamed
//
// Reads take messages with consumers, acknowledging nothing, then close their channel:
// RabbitMQ gives every unacknowledged message of a closed channel back to its queue, in
// place, so reading leaves the queue as it was (measured on RabbitMQ 3.10 for classic and
// quorum queues, 3,000 messages read over many consumers). A consumer's prefetch window
// bounds what the client holds: once a consumer holds nearly a window of messages it keeps,
// the reader cancels it and starts the next one on the same channel (see reader), so memory
// stays flat however long the queue, and a read streams at the broker's pace instead of a
// basic.get round trip per message (basic.get costs about 3 ms a message on a quorum
// queue, and a quorum queue takes messages fetched with basic.get back in an order of its
// own). A read takes every message the queue held when it started, even when it needs
// only the first (Messages with a visit that stops, Show), so that all of them go back in
// order.
// Messages that arrive while a read runs, or a read cut short, can end up ahead of older
// ones on a quorum queue.
//
// While a read runs, the messages it holds are unacknowledged, not ready: a concurrent
// count of ready messages is lower for that time; a read waits, when it ends, until the
// queue counts them as ready again, so the next operation sees them all. On quorum queues
// RabbitMQ counts each return as a delivery attempt (x-delivery-count grows by one per
// read). sluice declares quorum DLQs and archives with x-delivery-limit 2147483647 (the
// largest 32-bit value), so no number of reads deletes a dead letter (RabbitMQ 4.x
// gives quorum queues a default limit of 20; -1, its "unlimited", makes 3.x drop every
// message at its first return).
//
// # Message ids
//
// A record's id is the message's Watermill id (header _watermill_message_uuid), else its
// AMQP message-id, else "sha256:" and the first 16 hex digits of the payload's SHA-256, so
// a message without any id (dead-lettered by RabbitMQ from a foreign producer) still has
// one that is the same on every read.
//
// # Bulk moves are crash safe: one transaction per batch
//
// Operator.Replay sends selected messages to their original queue (header
// x-original-queue, else Q), or to Options.To, through the default exchange, with the retry
// state reset: the retry and failure-record headers are removed, x-replay-count is
// incremented, and the message id, payload, AMQP properties, trace context (traceparent,
// tracestate) and every other header are kept. Archive moves them unchanged (stamped
// x-archived-at) to Q.dlq.archive; Purge deletes them. All three read the source as above
// on a channel in transaction mode (tx.select) and move the selected messages in batches
// (BatchSize, 500 by default):
//
//	for each batch: check the destination queue exists (passive declare, on a second
//	                channel); publish (mandatory) every selected message of the batch to its
//	                destination and every skipped one, unchanged, to the source's tail
//	                (not mandatory: the source exists);
//	                basic.ack every source copy; tx.commit
//
// A run goes through exactly the messages the source held when it started (its ready
// count), so once it ends the skipped messages are in the source again, in their order
// (a message dead-lettered during the run can end up among them, ahead of some). That
// order is what RabbitMQ makes of the publishes: on a quorum queue it has not always kept
// it (once, in a full CI run on RabbitMQ 4.3.6 with two loaded cores, the first ten
// skipped messages of a 3,000-message run came back behind later ones, every message
// kept; not reproduced in 33 runs since, loaded or not). Every message stays, once. Until its
// first match a run holds the skipped messages instead, as long as they fit in its window
// (about 1,500), and they go back in place when it ends: a selector that matches nothing
// in a source that small writes nothing; in a larger one it rewrites it, in order.
//
// Why skipped messages are published again rather than held unacknowledged until the end,
// for RabbitMQ to requeue: a classic queue (version 1, RabbitMQ 3.10) puts requeued
// messages back one at a time, each at its place, which took about 100 s for 15,000 once
// the moved ones between them were acknowledged, and a channel finds an acknowledged
// message by scanning its unacknowledged ones from the oldest, so holding thousands forced
// the reader to switch channels (see reader) and each switch could leave a message in
// flight unseen. Measured on the shared 2-core machine, selecting 5,000 of 20,000: holding
// (consumer replaced every 2,000) had moved 3,500 after 5 minutes; publishing back finished
// in 96 s. Publishing back costs one publish per skipped message, inside the batch's
// transaction, so it is as crash safe as the move itself; it bounds a selective run at
// about the rate of a replay of the whole source (see BenchmarkDLQ).
//
// The publishes of a batch and the removal of their source copies are committed together,
// so a process killed at any point (SIGKILL included) neither loses a message nor leaves
// it both moved and in the source: an uncommitted transaction is discarded with the
// connection, and the messages the channel held unacknowledged go back to the source.
// Run the operation again to finish. Why a transaction rather than publisher confirms
// followed by acks: with confirms, a process killed after a confirm and before its ack
// leaves the message in both queues, and telling those duplicates apart on the next run
// needs a stamp on every copy and a scan of the destination, which is a queue other
// consumers drain; the transaction makes the pair atomic with one round trip per batch,
// and its cost is spread over the batch. BenchmarkDLQ measures each operation beside a raw
// client's confirmed publishes and beside raw-tx, a plain client doing the same
// transactional move with nothing of sluice's: the broker's work for a crash-safe move
// (a delivery, a publish, an ack and a share of a commit per message) bounds both alike.
//
// Why the destination check comes before the publishes: inside a transaction RabbitMQ
// sends the basic.return of an unroutable mandatory publish only when the transaction
// commits (measured on RabbitMQ 3.10), that is, after the acknowledgement of the source
// copy has been committed too. So a batch checks each destination just before publishing,
// and if a queue vanishes in between and a publish is returned at commit, the operation
// publishes the untouched source copy back to the source in a second transaction and
// reports the message as not moved (Result.Failed). Only a process killed in that
// window, while the destination is being deleted, could lose that one message.
//
// A run reads at most the number of messages the source held when it started, and ends
// early when the source has had no ready message for about a second. It uses one channel
// and one consumer throughout, so no delivery is ever in flight to a consumer it left; the
// few messages delivered past its end (within the prefetch window) go back when it closes.
// A dry run holds every message like a read, and like a read replaces its consumer only
// once the window is full. A replayed message that fails again and comes back to the DLQ
// (at its tail) during the run is left there rather than replayed in a loop. A selector
// that matches nothing is ErrNothingSelected.
//
// # The archive
//
// Archive creates Q.dlq.archive when it does not exist, durable, with x-message-ttl
// Options.Retention (14 days by default, counted from the archiving), classic
// unless Options.ArchiveType says quorum. An archive that exists is used as it is; a
// RabbitMQ policy with message-ttl on it overrides the argument when it is lower.
// Inspector.From and Options.From read, replay and purge the archive like a DLQ.
package dlq
