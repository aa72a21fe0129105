// Package outbox keeps a producer's messages when RabbitMQ cannot take them, so that an
// outage never loses a message an application handed over.
//
// Publisher wraps a confirmed publisher (sluice's *amqp.Publisher, or a failover.Publisher
// over two clusters): a publish the broker does not confirm within a short deadline is
// written to a local bbolt file and fsynced, and a forwarder publishes the file's entries
// in order when the broker takes messages again, removing each after its confirm.
//
// For several producer instances, or to write messages in the same transaction as the
// application's own data, package outbox/pgoutbox sets up Watermill's SQL forwarder on
// PostgreSQL instead: producers publish into a table, and one forwarder moves the rows to
// RabbitMQ with confirms, deleting each row after its confirm.
//
// # Exactly once, as the consumer sees it
//
// Both paths publish at least once. A message whose confirm was lost when the broker went
// away (or, on the file path, was confirmed just before the process died, before its
// entry was removed) may have been stored by the broker and is sent again. No producer
// can tell that message from one the broker never got: the broker cannot be asked, and no
// record the producer keeps (a file entry, a table row, a "forwarded ids" table written
// in the row's transaction) can be committed together with the broker's write. Recording
// forwarded ids next to the outbox would only repeat what deleting the entry already
// records, with the same gap before it.
//
// So the copies are recognised where they arrive, which is what Watermill's forwarder
// with its Deduplicator middleware and MassTransit's outbox with its inbox do. Every copy
// carries the message's id: the Watermill UUID the producer gave the message, stored in
// the outbox file and carried by Watermill's forwarder in its envelope, is the AMQP
// message-id of each copy. The consumer's idempotency step (router.Config.Idempotency,
// package middleware/idempotency) keys a message without an idempotency key of its own on
// that id, acknowledges a copy of a message already processed without calling the
// handler, and so each message's side effect happens once. Give every message a fresh
// UUID (message.NewMessage(watermill.NewUUID(), payload)); an idempotency-key header, or
// a business key the handler's key function derives, takes precedence over the id and
// works the same way. What the idempotency step remembers, and for how long, is in its
// package documentation.
package outbox
