package memory_test

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/brokertest"
	"github.com/sluice-go/sluice/broker/memory"
)

// The embedded broker meets package broker's contract (package brokertest). It has none of
// the optional capabilities: one process holds every consumer, so there is nothing to
// count, join or journal, and it counts no deliveries and holds nothing back itself.
func TestConformance(t *testing.T) {
	brokertest.Run(t, func(*testing.T) broker.Broker {
		return memory.New(memory.Config{DrainTimeout: 300 * time.Millisecond})
	}, brokertest.Features{})
}
