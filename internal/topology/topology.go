// Package topology builds every queue and exchange name sluice declares or reads, so that each
// name is spelled in one place (docs/DESIGN.md, "Topology names"). The brokers, the steps, the
// failure operations (package dlq), telemetry and the commands all call it.
//
// The names are a contract with operators — they see Q.dlq in the management UI and in
// alerts — but not a Go API users build on: the packages users call take a queue name and
// derive the rest, and package dlq keeps DLQName and ArchiveName for the operator's own code.
// So the functions live here, under internal/, rather than in the root package's vocabulary.
package topology

import (
	"fmt"
	"strconv"
)

// Suffixes and prefixes of derived names.
const (
	// DeadLetterSuffix is appended to a queue's name to name its dead-letter queue: Q.dlq.
	DeadLetterSuffix = ".dlq"
	// ArchiveSuffix is appended to a dead-letter queue's name to name its archive.
	ArchiveSuffix = ".archive"
	// PartitionInfix separates a partitioned queue's name from a partition's number: Q.p0.
	PartitionInfix = ".p"
	// MembersPrefix names the fanout exchange of a partitioned handler's instances.
	MembersPrefix = "sluice.members."
	// IdempotencyPrefix names a queue's journal of done idempotency keys (a stream).
	IdempotencyPrefix = "sluice.idempotency."
)

// Names shared by every queue of a vhost.
const (
	// DeadLetterExchange is the direct exchange that routes dead letters to Q.dlq by key Q.
	DeadLetterExchange = "sluice.dlx"
	// DelayDestination is the delay cascade as a whole: the destination of a retry or
	// deferral hand-off, whatever queue the message returns to afterwards.
	DelayDestination = "sluice.delay"
	// DelayExchangePrefix names the cascade's level exchanges and queues: sluice.delay.00 …
	DelayExchangePrefix = DelayDestination + "."
	// DelayDeliveryExchange receives what leaves the cascade and routes it to its queue.
	DelayDeliveryExchange = DelayExchangePrefix + "deliver"
	// UnroutedExchange is the alternate exchange of every exchange sluice declares.
	UnroutedExchange = "sluice.unrouted"
	// UnroutedQueue keeps what UnroutedExchange receives.
	UnroutedQueue = "sluice.unrouted"
	// Audit is the durable fanout exchange every operator action is recorded on, and the
	// durable queue bound to it that keeps the records.
	Audit = "sluice.audit"
)

// DLQ returns the dead-letter queue of queue: Q.dlq. A partitioned queue's partitions share
// the queue's.
func DLQ(queue string) string { return queue + DeadLetterSuffix }

// Archive returns the archive of queue's dead letters: Q.dlq.archive.
func Archive(queue string) string { return DLQ(queue) + ArchiveSuffix }

// Partition returns the name of partition k of queue: Q.pK.
func Partition(queue string, k int) string { return queue + PartitionInfix + strconv.Itoa(k) }

// PartitionExchange returns the consistent-hash exchange producers publish queue's messages
// to, with the partition key as routing key. It has the queue's own name: exchanges and
// queues are separate namespaces, and a producer needs to know only one name.
func PartitionExchange(queue string) string { return queue }

// IdempotencyJournal returns the stream that journals the done idempotency keys of the
// handler consuming queue (a partition, for a partitioned handler): sluice.idempotency.Q.
// It is named after the queue rather than the handler because a queue's consumers are one
// service's instances, while two services on a vhost may well name their handlers alike.
func IdempotencyJournal(queue string) string { return IdempotencyPrefix + queue }

// Members returns the fanout exchange over which the instances of queue's partitioned
// handler announce themselves: sluice.members.Q.
func Members(queue string) string { return MembersPrefix + queue }

// DelayLevel returns the exchange and queue name of level k of the binary delay cascade
// sluice 0.1.0 declared: sluice.delay.KK. Sluice no longer declares it, but a vhost may
// still hold messages parked in it; they keep draining through it.
func DelayLevel(k int) string { return fmt.Sprintf("%s%02d", DelayExchangePrefix, k) }

// DelayDigit returns the exchange of digit j of the delay cascade: sluice.delay.dJ.
func DelayDigit(j int) string { return fmt.Sprintf("%sd%d", DelayExchangePrefix, j) }

// DelayDigitQueue returns the queue of digit j holding value v: sluice.delay.dJ.VV.
func DelayDigitQueue(j, v int) string { return fmt.Sprintf("%sd%d.%02d", DelayExchangePrefix, j, v) }

// NoDeliveryLimit is the x-delivery-limit sluice gives the quorum queues that hold dead
// letters (Q.dlq, Q.dlq.archive). Every read of such a queue returns its messages, and a
// quorum queue counts each return as a delivery: RabbitMQ 4.x's default limit of 20 would
// delete a dead letter read 20 times. -1, which 4.x reads as "no limit", makes RabbitMQ 3.x
// drop every message at its first return (measured on 3.10), so sluice uses the largest
// 32-bit value instead, which no number of reads reaches, on every version. Moved from
// broker/amqp.
const NoDeliveryLimit = 1<<31 - 1

// DeadLetterArgs returns the arguments of a queue of type queueType ("classic", "quorum")
// that holds dead letters, with extra: quorum ones get NoDeliveryLimit. The broker declares
// Q.dlq with them and package dlq the archives. Moved from broker/amqp
// (DeadLetterQueueArgs).
func DeadLetterArgs(queueType string, extra map[string]any) map[string]any {
	args := map[string]any{"x-queue-type": queueType}
	for k, v := range extra {
		args[k] = v
	}
	if queueType == "quorum" {
		args["x-delivery-limit"] = int64(NoDeliveryLimit)
	}
	return args
}
