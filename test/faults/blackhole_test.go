//go:build faults

package faults

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// detectBound is when a blackholed connection must be given up: amqp091 waits three
// heartbeat intervals (the node's 2s here) without a frame.
const detectBound = 3 * serverHeartbeat

// testBlackhole is scenario 2: the first node of the list starts swallowing every packet
// (no RST). Heartbeats detect it, publishes waiting for confirms are published again on the
// next node of the list and never reported confirmed before that, and nothing is lost.
func testBlackhole(t *testing.T, node *testenv.Node) {
	rabbit := node.Rabbit(t)
	prx := newProxy(t, "127.0.0.1:"+strconv.Itoa(node.Port))
	base := takeBaseline(t, node)

	sc := newScenario(t, "faults.blackhole")
	l, queue := sc.l, sc.queue
	// The proxy first, the node itself second: "another node" of the list.
	st := sc.start(t, amqp.Config{URLs: []string{prx.url(), node.URL()}, ReconnectMaxInterval: time.Second}, 4, 16, 5*time.Millisecond)

	before := make([]string, 200)
	for i := range before {
		before[i] = idFor("bh-before-", i)
	}
	publishAll(l, st.broker.Publisher(), queue, before, 20, 2, 30*time.Second)

	// Swallow everything both ways, then publish while the client cannot know yet.
	prx.add("blackhole-up", "timeout", "upstream", `{"timeout":0}`)
	prx.add("blackhole-down", "timeout", "downstream", `{"timeout":0}`)
	holed := time.Now()
	during := make([]string, 200)
	for i := range during {
		during[i] = idFor("bh-during-", i)
	}
	var wg sync.WaitGroup
	var firstConfirm time.Duration
	var mu sync.Mutex
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < len(during); i += 4 {
				publishAll(l, st.broker.Publisher(), queue, during[i:i+1], 1, 1, 60*time.Second)
				mu.Lock()
				if l.outcome(during[i]) == confirmed && firstConfirm == 0 {
					firstConfirm = time.Since(holed)
				}
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	t.Logf("blackhole: first confirm %s after the blackhole began (heartbeat %s, detection bound %s)", firstConfirm.Round(time.Millisecond), serverHeartbeat, detectBound)
	assert.Less(t, firstConfirm, detectBound+10*time.Second, "detected and failed over within three heartbeats and a reconnect")

	waitSettled(t, l, rabbit, queue, 2*time.Minute)
	prx.remove("blackhole-up")
	prx.remove("blackhole-down")
	st.close()
	s := l.check(t, 1)
	assert.Zero(t, s.Failed, "failures: %v", l.failures(5))
	assert.Zero(t, s.Failed, "every publish caught by the blackhole was published again and confirmed")
	t.Logf("blackhole: %s", fmt.Sprintf("%+v", s))
	_ = sc.guard.Close()
	prx.p.Stop()
	base.verify(t)
}
