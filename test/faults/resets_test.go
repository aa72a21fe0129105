//go:build faults

package faults

import (
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// Scenario 3 numbers.
const (
	resetMessages = 5000
	// resetWindow is how long each burst of resets lasts: every connection that sends or
	// receives meanwhile is reset, and so is every reconnect attempt.
	resetWindow = 400 * time.Millisecond
)

// testResets is scenario 3: connections reset (RST) at random moments while 5,000 messages
// go through. Nothing confirmed is lost, side effects happen once, and reconnect attempts
// are bounded (a few per burst) and jittered.
func testResets(t *testing.T, node *testenv.Node) {
	rabbit := node.Rabbit(t)
	prx := newProxy(t, "127.0.0.1:"+strconv.Itoa(node.Port))
	base := takeBaseline(t, node)

	sc := newScenario(t, "faults.resets")
	logs, l, queue := sc.logs, sc.l, sc.queue
	st := sc.start(t, amqp.Config{URLs: []string{prx.url()}, Logger: sc.log, ReconnectMaxInterval: 2 * time.Second}, 8, 32, 0)

	stop := make(chan struct{})
	bursts := make(chan int, 1)
	go func() {
		n := 0
		defer func() { bursts <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(300*time.Millisecond + rand.N(time.Second)):
			}
			prx.add("reset-up", "reset_peer", "upstream", `{"timeout":0}`)
			prx.add("reset-down", "reset_peer", "downstream", `{"timeout":0}`)
			time.Sleep(resetWindow)
			prx.remove("reset-up")
			prx.remove("reset-down")
			n++
		}
	}()

	ids := make([]string, resetMessages)
	for i := range ids {
		ids[i] = idFor("rst-", i)
	}
	took := publishAll(l, st.broker.Publisher(), queue, ids, 25, 4, 2*time.Minute)
	require.Eventually(t, func() bool {
		l.drainDLQ(rabbit, queue)
		return l.settled()
	}, 3*time.Minute, 200*time.Millisecond, "every confirmed message processed or dead-lettered")
	close(stop)
	n := <-bursts
	st.close()

	s := l.check(t, 1)
	t.Logf("resets: %d bursts of %s during %d messages (published in %s): %+v", n, resetWindow, resetMessages, took.Round(time.Millisecond), s)
	require.Positive(t, n, "connections were reset")
	assert.Zero(t, s.Failed, "every publish cut by a reset was published again: %v", l.failures(5))

	out := logs.String()
	connects := strings.Count(out, `msg="connected to RabbitMQ"`)
	failures := strings.Count(out, `msg="reconnect to RabbitMQ failed"`)
	t.Logf("resets: %d connects, %d failed reconnect attempts for %d bursts", connects, failures, n)
	// Two connections, each reconnecting at most once per burst after a bounded number of
	// attempts while the burst lasts (100ms growing backoff in a 400ms window).
	assert.LessOrEqual(t, connects, 2+2*n, "at most one reconnect per connection and burst")
	assert.LessOrEqual(t, failures, 2*n*6, "reconnect attempts are bounded by the backoff")
	// Jitter: the waits the backoff chose are not all alike.
	waits := map[string]bool{}
	for _, m := range regexp.MustCompile(`retry_in=(\S+)`).FindAllStringSubmatch(out, -1) {
		waits[m[1]] = true
	}
	if failures >= 3 {
		assert.Greater(t, len(waits), 1, "reconnect waits are jittered")
	}
	_ = sc.guard.Close()
	prx.p.Stop()
	base.verify(t)
}
