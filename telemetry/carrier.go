package telemetry

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
)

// MetadataCarrier adapts watermill message metadata to a propagation.TextMapCarrier, so a
// propagator can inject trace context into a message's headers and extract it again.
type MetadataCarrier message.Metadata

var _ propagation.TextMapCarrier = MetadataCarrier(nil)

// Get returns the value stored under key, or "" if there is none.
func (c MetadataCarrier) Get(key string) string { return c[key] }

// Set stores value under key. It panics on a nil carrier, like writing to a nil map.
func (c MetadataCarrier) Set(key, value string) { c[key] = value }

// Keys lists the keys stored in the carrier.
func (c MetadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
