// Package outbox keeps a producer's messages when RabbitMQ cannot take them, so that an
// outage never loses a message an application handed over.
//
// Publisher wraps a confirmed publisher (sluice's *amqp.Publisher, or a failover.Publisher
// over two clusters): a publish the broker does not confirm within a short deadline is
// written to a local bbolt file and fsynced, and a forwarder publishes the file's entries
// in order when the broker takes messages again, removing each after its confirm.
//
// For several producer instances, or to write messages in the same transaction as the
// application's own data, NewPostgresOutbox sets up Watermill's SQL forwarder on
// PostgreSQL instead: producers publish into a table, and one forwarder moves the rows to
// RabbitMQ with confirms, deleting each row after its confirm.
package outbox
