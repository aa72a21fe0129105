package headers

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
)

// DeliveryCount is the broker's count of md's earlier failed deliveries: RabbitMQ's
// x-delivery-count on a quorum queue, which it sets on a redelivery (on 4.3, after each
// rejection or lost connection). It is read only on a redelivery (Redelivered): on a first
// delivery the header can only be a producer's. It is read by x-retry-count's rule
// (sluice.RetryCount): missing, unreadable or negative is 0, huge is
// sluice.MaxRetryCountHeader.
func DeliveryCount(md message.Metadata) int {
	if md.Get(Redelivered) != "true" {
		return 0
	}
	return parseCount(md.Get("x-delivery-count"))
}

// NativeRetries is the retries md has had under a queue's native delayed retry:
// x-retry-count (the cascade's) plus the queue's redeliveries (DeliveryCount), at most
// sluice.MaxRetryCountHeader. It returns the redeliveries too.
func NativeRetries(md message.Metadata) (retries, redeliveries int) {
	redeliveries = DeliveryCount(md)
	return min(sluice.RetryCount(md)+redeliveries, sluice.MaxRetryCountHeader), redeliveries
}
