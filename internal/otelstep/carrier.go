package otelstep

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
)

// metadataCarrier adapts watermill message metadata to a propagation.TextMapCarrier, so a
// propagator can inject trace context into a message's headers and extract it again.
type metadataCarrier message.Metadata

var _ propagation.TextMapCarrier = metadataCarrier(nil)

// Get returns the value stored under key, or "" if there is none.
func (c metadataCarrier) Get(key string) string { return c[key] }

// Set stores value under key. It panics on a nil carrier, like writing to a nil map.
func (c metadataCarrier) Set(key, value string) { c[key] = value }

// Keys lists the keys stored in the carrier.
func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
