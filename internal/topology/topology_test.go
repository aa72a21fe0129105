package topology_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice/internal/topology"
)

// TestNames: the names operators see, as docs/DESIGN.md lists them.
func TestNames(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{name: "dead-letter queue", got: topology.DLQ("payments"), want: "payments.dlq"},
		{name: "archive", got: topology.Archive("payments"), want: "payments.dlq.archive"},
		{name: "partition", got: topology.Partition("payments", 3), want: "payments.p3"},
		{name: "partition exchange", got: topology.PartitionExchange("payments"), want: "payments"},
		{name: "members", got: topology.Members("payments"), want: "sluice.members.payments"},
		{name: "delay level", got: topology.DelayLevel(3), want: "sluice.delay.03"},
		{name: "delay level 25", got: topology.DelayLevel(25), want: "sluice.delay.25"},
		{name: "delay digit", got: topology.DelayDigit(3), want: "sluice.delay.d3"},
		{name: "delay digit queue", got: topology.DelayDigitQueue(3, 8), want: "sluice.delay.d3.08"},
		{name: "delivery exchange", got: topology.DelayDeliveryExchange, want: "sluice.delay.deliver"},
		{name: "dead-letter exchange", got: topology.DeadLetterExchange, want: "sluice.dlx"},
		{name: "unrouted", got: topology.UnroutedQueue, want: "sluice.unrouted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.want, tt.got) })
	}
}
