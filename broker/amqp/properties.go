package amqp

import hdr "github.com/sluice-go/sluice/internal/headers"

// Metadata keys that carry AMQP properties. The marshaler fills them on consume and turns
// them back into properties on publish, so a republished copy (retry, DLQ, replay) keeps the
// producer's properties. The content type uses the conventional "content-type" key, so a
// handler that sets it on its output (as Watermill users do) gets the AMQP property.
const (
	MetadataContentType   = hdr.ContentType
	MetadataCorrelationID = hdr.CorrelationID
	MetadataType          = hdr.Type
	// MetadataRoutingKey and MetadataExchange say where the delivery came from; read-only.
	MetadataRoutingKey = hdr.RoutingKey
	MetadataExchange   = hdr.Exchange
	// MetadataRedelivered is "true" when RabbitMQ delivered the message before; read-only.
	MetadataRedelivered = hdr.Redelivered

	// The marshaler's bookkeeping keys, the prefix of a producer's header whose name a
	// property key takes, the list of dropped headers, the header-type record and
	// Watermill's message id header, are in internal/headers (MetadataPrefix, Dropped,
	// HeaderTypes, UUID).
)

// headerKey is the metadata key Unmarshal gives the header called name.
func headerKey(name string) string {
	if hdr.Reserved(name) {
		return hdr.MetadataPrefix + name
	}
	return name
}
