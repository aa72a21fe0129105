package amqp

import (
	"strings"

	hdr "github.com/sluice-go/sluice/internal/headers"
)

// Metadata keys that carry AMQP properties. The marshaler fills them on consume and turns
// them back into properties on publish, so a republished copy (retry, DLQ, replay) keeps the
// producer's properties. The content type uses the conventional "content-type" key, so a
// handler that sets it on its output (as Watermill users do) gets the AMQP property.
const (
	MetadataContentType     = "content-type"
	metadataContentEncoding = "amqp-content-encoding"
	MetadataCorrelationID   = "amqp-correlation-id"
	metadataReplyTo         = "amqp-reply-to"
	MetadataType            = "amqp-type"
	metadataAppID           = "amqp-app-id"
	metadataPriority        = "amqp-priority"
	metadataDeliveryMode    = "amqp-delivery-mode"
	metadataTimestamp       = "amqp-timestamp"
	metadataMessageID       = "amqp-message-id"
	// MetadataRoutingKey and MetadataExchange say where the delivery came from; read-only.
	MetadataRoutingKey = "amqp-routing-key"
	MetadataExchange   = "amqp-exchange"
	// MetadataRedelivered is "true" when RabbitMQ delivered the message before; read-only.
	MetadataRedelivered = "amqp-redelivered"

	// The marshaler's bookkeeping keys, the prefix of a producer's header whose name a
	// property key takes, the list of dropped headers, the header-type record and
	// Watermill's message id header, are in internal/headers (MetadataPrefix, Dropped,
	// HeaderTypes, UUID).
)

// readOnlyMetadata are filled on consume and never published as headers.
var readOnlyMetadata = map[string]bool{
	MetadataRoutingKey:  true,
	MetadataExchange:    true,
	MetadataRedelivered: true,
	hdr.HeaderTypes:     true,
	metadataMessageID:   true,
}

// reservedMetadataKey reports whether key has a meaning of its own to the marshaler, so
// that a header of that name must live in metadata under headers.MetadataPrefix.
func reservedMetadataKey(key string) bool {
	switch key {
	case MetadataContentType, metadataContentEncoding, MetadataCorrelationID, metadataReplyTo,
		MetadataType, metadataAppID, metadataPriority, metadataDeliveryMode, metadataTimestamp:
		return true // the properties Marshal publishes
	}
	return readOnlyMetadata[key] || strings.HasPrefix(key, hdr.MetadataPrefix)
}

// headerKey is the metadata key Unmarshal gives the header called name.
func headerKey(name string) string {
	if reservedMetadataKey(name) {
		return hdr.MetadataPrefix + name
	}
	return name
}

// HeaderName returns the AMQP header that metadata key stands for: the key itself, or the
// name a headers.MetadataPrefix key holds. ok is false for the keys that carry properties
// and delivery facts (MetadataContentType … MetadataRedelivered, hdr.HeaderTypes).
func HeaderName(key string) (name string, ok bool) {
	if rest, found := strings.CutPrefix(key, hdr.MetadataPrefix); found {
		if reservedMetadataKey(rest) {
			return rest, true
		}
		return key, true // not one Unmarshal makes: a header of that very name
	}
	if reservedMetadataKey(key) {
		return "", false
	}
	return key, true
}
