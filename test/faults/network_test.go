//go:build faults

package faults

import (
	"testing"

	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// TestNetworkFaults runs the scenarios that leave the node itself alone (the fault is in
// the network, or a queue) on one node: a node start costs more than most scenarios. Each
// takes its own baseline and uses queues of its own.
func TestNetworkFaults(t *testing.T) {
	node := startNode(t)
	for _, sc := range []struct {
		name string
		run  func(*testing.T, *testenv.Node)
	}{
		{"latency", testLatency},
		{"blackhole", testBlackhole},
		{"resets", testResets},
		{"cut-frames-slow-close", testCutFramesAndSlowClose},
		{"queue-deleted", testQueueDeletedUnderConsumer},
	} {
		t.Run(sc.name, func(t *testing.T) { sc.run(t, node) })
	}
}
