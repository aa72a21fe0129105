package headers

import "strings"

// The metadata keys the marshaler (package broker/amqp) gives AMQP properties and delivery
// facts: broker/amqp's Metadata* constants are these values. They are here so that
// HeaderName, which package dlq calls too, knows them.
const (
	ContentType     = "content-type"
	ContentEncoding = "amqp-content-encoding"
	CorrelationID   = "amqp-correlation-id"
	ReplyTo         = "amqp-reply-to"
	Type            = "amqp-type"
	AppID           = "amqp-app-id"
	Priority        = "amqp-priority"
	DeliveryMode    = "amqp-delivery-mode"
	Timestamp       = "amqp-timestamp"
	MessageID       = "amqp-message-id"
	RoutingKey      = "amqp-routing-key"
	Exchange        = "amqp-exchange"
	Redelivered     = "amqp-redelivered"
)

// ReadOnly reports whether the marshaler fills metadata key on consume and never publishes
// it as a header.
func ReadOnly(key string) bool {
	switch key {
	case RoutingKey, Exchange, Redelivered, HeaderTypes, MessageID:
		return true
	}
	return false
}

// Reserved reports whether key has a meaning of its own to the marshaler, so that a header
// of that name must live in metadata under MetadataPrefix.
func Reserved(key string) bool {
	switch key {
	case ContentType, ContentEncoding, CorrelationID, ReplyTo, Type, AppID, Priority, DeliveryMode, Timestamp:
		return true // the properties Marshal publishes
	}
	return ReadOnly(key) || strings.HasPrefix(key, MetadataPrefix)
}

// HeaderName returns the AMQP header that metadata key stands for: the key itself, or the
// name a MetadataPrefix key holds. ok is false for the keys that carry properties and
// delivery facts (ContentType … Redelivered, HeaderTypes). Moved from broker/amqp.
func HeaderName(key string) (name string, ok bool) {
	if rest, found := strings.CutPrefix(key, MetadataPrefix); found {
		if Reserved(rest) {
			return rest, true
		}
		return key, true // not one Unmarshal makes: a header of that very name
	}
	if Reserved(key) {
		return "", false
	}
	return key, true
}
