package headers

import (
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
)

// DeliveryCount is the broker's count of md's earlier failed deliveries: RabbitMQ's
// x-delivery-count on a quorum queue, which it sets on a redelivery (on 4.3, after each
// rejection or lost connection). It is read only on a redelivery (Redelivered): on a first
// delivery the header can only be a producer's. A missing, unreadable or negative count is
// 0; one above limit is limit.
func DeliveryCount(md message.Metadata, limit int) int {
	if md.Get(Redelivered) != "true" {
		return 0
	}
	raw := strings.TrimSpace(md.Get("x-delivery-count"))
	if raw == "" {
		return 0
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return int(min(n, int64(limit)))
}
