// Package amqp is sluice's RabbitMQ broker: a connection that reconnects and fails over
// between nodes, a confirmed publisher with many messages in flight, a concurrent
// subscriber, a marshaler that never rejects a message for its headers, and the topology
// the failure paths need: each consumed queue Q with its dead-letter queue Q.dlq behind the
// direct exchange sluice.dlx, and the shared delay cascade sluice.delay.* that holds retried
// messages without any plugin.
//
// # Where a message goes
//
//   - consumed from Q by Subscriber; acked only after whatever replaces it is confirmed;
//   - retried: Broker.Delay publishes a copy to the cascade (see delay.go), which
//     dead-letters it back into Q after exactly the delay;
//   - dead-lettered: Broker.DeadLetter publishes a copy to sluice.dlx with routing key Q,
//     which routes it to Q.dlq;
//   - handler output: Publisher.Publish(topic) publishes to the default exchange with the
//     topic as routing key (a queue of that name).
package amqp
