// Package amqp is sluice's RabbitMQ broker: a connection that reconnects and fails over
// between nodes, a confirmed publisher with many messages in flight, a concurrent
// subscriber, a marshaler that never rejects a message for its headers, and the topology
// the failure paths need: each consumed queue Q with its dead-letter queue Q.dlq behind the
// direct exchange sluice.dlx, and the shared delay cascade sluice.delay.* that holds retried
// messages without any plugin.
//
// # Where a message goes
//
//   - consumed from Q by Subscriber; acked only after whatever replaces it is confirmed.
//     Acks that are ready within Config.AckDelay (1ms) of each other leave as one
//     basic.ack with multiple set (acker.go), which saves the broker a frame per message;
//     a slow message never holds the others' acks back;
//   - retried: Broker.Delay publishes a copy to the cascade (see delay.go), which
//     dead-letters it back into Q after exactly the delay;
//   - dead-lettered: Broker.DeadLetter publishes a copy to sluice.dlx with routing key Q,
//     which routes it to Q.dlq;
//   - handler output: Publisher.Publish(topic) publishes to the default exchange with the
//     topic as routing key (a queue of that name).
//   - publish/subscribe (exchange.go): Broker.DeclareSubscription binds Q to exchanges;
//     Broker.PublishToExchange publishes to one; every exchange sluice declares has the
//     alternate exchange sluice.unrouted, whose queue keeps what nobody is bound for.
//
// # Partitioned queues
//
// Several instances of a service can share a queue and still keep in-memory idempotency
// exact if every message of one key is consumed by one instance. Broker.DeclarePartitioned
// (used by router.WithPartitions) makes queue Q into P partition queues Q.p0 … Q.p(P-1),
// each with x-single-active-consumer: every instance consumes every partition, RabbitMQ
// delivers a partition to one consumer at a time and hands it to a waiting one when that
// consumer goes away (its connection closes, its process dies). The partitions are quorum
// queues when Config.QueueType is quorum, which a cluster needs so that a partition
// survives the loss of a node.
//
// RabbitMQ hashes, not the producer: Q.p0 … are bound to a consistent-hash exchange named
// Q (type x-consistent-hash, each binding with weight 1), and a producer publishes to
// exchange Q with the partition key — the message's idempotency key, such as a payment
// id — as routing key (Broker.PublishPartitioned; any AMQP client does the same with
// basic.publish to exchange "Q", routing key the key, mandatory, persistent, with
// confirms). So producers need no sluice code, no hash function and no partition count,
// and they cannot disagree about the partition of a key: only the broker computes it, and
// the count lives in one place, the bindings the consumers declare. A hash in the
// producer would need the same function and the same count in every producer, in every
// language, and a change of count rolled out to all of them at once. The cost is RabbitMQ's
// consistent-hash plugin, which ships with RabbitMQ but is off by default: enable it on
// every node with
//
//	rabbitmq-plugins enable rabbitmq_consistent_hash_exchange
//
// A node without it refuses the exchange type by closing the whole connection, so
// DeclarePartitioned declares on a short-lived connection of its own and returns
// ErrConsistentHashUnavailable, saying the above. A publish to queue Q through the default
// exchange is unroutable (there is no queue Q): producers must use the exchange.
//
// Retries and deferrals come back to the partition they left: the retry step hands a
// message to the delay cascade for the queue it was consumed from, Q.pK, and each
// partition is bound to the cascade's delivery exchange. The partitions share one
// dead-letter queue, Q.dlq, bound to sluice.dlx with every partition's name as key: the
// operator finds all of Q's dead letters in one place (sluice dlq list --queue Q), and
// every record names its partition in x-original-queue, so a replay (sluice dlq replay
// --queue Q) puts each message back into the partition its key hashes to. RabbitMQ's own
// dead-lettering of a partition (a quorum queue's delivery limit) lands in Q.dlq too, by
// x-dead-letter-routing-key Q.pK; such a record has no x-original-queue, only RabbitMQ's
// x-first-death-queue.
//
// Changing the count: declaring more partitions adds bindings, and the consistent hash
// moves a share of the keys to the new partitions, where their idempotency history is not
// known. Declaring fewer is refused (broker.ErrInequivalent) while partition P exists, since
// the exchange would keep routing keys to it: drain and delete the surplus partitions
// first. Quorum queues with single-active-consumer refuse basic.get (RESOURCE_LOCKED), so
// a partition is inspected by consuming it or through the management UI.
package amqp
