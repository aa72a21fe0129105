//go:build faults

package faults

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// cutAfter is where limit_data cuts a connection: tens of frames in, so the cut lands
// inside a frame, not between two.
const cutAfter = 40_007

// testCutFramesAndSlowClose is scenario 4: connections cut in the middle of a frame
// (toxiproxy limit_data, each way in turn) while messages flow, then a slow close (the
// proxy holds the TCP close for seconds). Nothing confirmed is lost, side effects happen
// once, and Broker.Close returns without waiting for the slow close.
func testCutFramesAndSlowClose(t *testing.T, node *testenv.Node) {
	rabbit := node.Rabbit(t)
	prx := newProxy(t, "127.0.0.1:"+strconv.Itoa(node.Port))
	base := takeBaseline(t, node)

	sc := newScenario(t, "faults.frames")
	logs, l, queue := sc.logs, sc.l, sc.queue
	st := sc.start(t, amqp.Config{URLs: []string{prx.url()}, Logger: sc.log, ReconnectMaxInterval: time.Second}, 4, 16, time.Millisecond)

	for _, stream := range []string{"upstream", "downstream"} {
		lost := strings.Count(logs.String(), "connection lost")
		prx.add("cut", "limit_data", stream, fmt.Sprintf(`{"bytes":%d}`, cutAfter))
		ids := make([]string, 1000)
		for i := range ids {
			ids[i] = idFor("cut-"+stream+"-", i)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			publishAll(l, st.broker.Publisher(), queue, ids, 10, 4, time.Minute)
		}()
		require.Eventually(t, func() bool { return strings.Count(logs.String(), "connection lost") > lost }, time.Minute, 20*time.Millisecond, "a %s cut closed a connection", stream)
		prx.remove("cut")
		<-done
		waitSettled(t, l, rabbit, queue, 2*time.Minute)
		t.Logf("%s cut after %d bytes: %d connection losses", stream, cutAfter, strings.Count(logs.String(), "connection lost")-lost)
	}

	prx.add("slow-close", "slow_close", "downstream", `{"delay":20000}`)
	prx.add("slow-close-up", "slow_close", "upstream", `{"delay":20000}`)
	begin := time.Now()
	st.close()
	took := time.Since(begin)
	t.Logf("stack and broker closed in %s behind a 20s slow close", took.Round(time.Millisecond))
	assert.Less(t, took, 15*time.Second, "Close does not wait for the slow close")

	s := l.check(t, 1)
	assert.Zero(t, s.Failed, "every publish cut in a frame was published again: %v", l.failures(5))
	t.Logf("cut frames: %+v", s)
	_ = sc.guard.Close()
	prx.p.Stop()
	base.verify(t)
}
