package brokertest_test

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/brokertest"
	"github.com/sluice-go/sluice/broker/memory"
)

// A broker's own tests run the suite: TestConformance in the broker's package, with a
// fresh broker per subtest and the Features it claims. The embedded broker claims none
// (a broker must not have an optional capability its Features leave out); broker/amqp's
// claims Prefetch, ConsumerCounter, Joiner and Journaler.
//
// Run needs the *testing.T of a running test, which an Example does not get, so this
// one is compiled, not run; broker/memory's TestConformance runs exactly this.
func Example() {
	testConformance := func(t *testing.T) {
		brokertest.Run(t, func(*testing.T) broker.Broker {
			// A short drain: the suite closes subscribers that hold messages.
			return memory.New(memory.Config{DrainTimeout: 300 * time.Millisecond})
		}, brokertest.Features{})
	}
	_ = testConformance
}
