package amqp

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/topology"
)

// simulateCascade follows a routing key through the cascade as RabbitMQ would route it with
// the bindings cascadeOn makes (matched here by their keys, as a topic exchange would), from
// the given entry exchange, and returns the total time the message waits in queues, how
// many queues it waits in and the queue it is delivered to.
func simulateCascade(t *testing.T, entry, key string) (time.Duration, int, string) {
	t.Helper()
	words := strings.Split(key, ".")
	require.Greater(t, len(words), DelayLevels, "key %q", key)
	var digit int
	_, err := fmt.Sscanf(entry, topology.DelayExchangePrefix+"d%d", &digit)
	require.NoError(t, err, "entry %q", entry)
	var waited time.Duration
	queues := 0
	for j := digit; j >= 0; j-- {
		matched := 0
		for v := 0; v < 1<<delayDigitWidth(j); v++ {
			if !topicMatch(delayDigitBindingKey(j, v), words) {
				continue
			}
			matched++
			if v > 0 { // to queue dJ.VV: wait its TTL, then dead-lettered to digit j-1
				waited += time.Duration(uint64(v)<<(j*delayDigitBits)) * DelayResolution
				queues++
			}
		}
		require.Equal(t, 1, matched, "bindings of digit %d matching %q", j, key)
	}
	// The delivery exchange binds "<*.>^DelayLevels Q" for each queue.
	return waited, queues, strings.Join(words[DelayLevels:], ".")
}

// topicMatch reports whether a binding key of `*`, `#` and words matches key's words.
func topicMatch(binding string, words []string) bool {
	pat := strings.Split(binding, ".")
	var match func(p, w int) bool
	match = func(p, w int) bool {
		switch {
		case p == len(pat):
			return w == len(words)
		case pat[p] == "#":
			for k := w; k <= len(words); k++ {
				if match(p+1, k) {
					return true
				}
			}
			return false
		case w == len(words):
			return false
		case pat[p] == "*" || pat[p] == words[w]:
			return match(p+1, w+1)
		}
		return false
	}
	return match(0, 0)
}

func TestCascadeDeliversEveryDelayExactly(t *testing.T) {
	units := []uint64{0, 1, 2, 3, 7, 8, 100, 1000, 12345, 1<<DelayLevels - 1}
	for i := 0; i < 200; i++ {
		units = append(units, rand.Uint64N(1<<DelayLevels))
	}
	for _, u := range units {
		key := delayRoutingKey(u, "payments.requested")
		waited, queues, dest := simulateCascade(t, delayEntryExchange(u), key)
		assert.Equal(t, time.Duration(u)*DelayResolution, waited, "units %d", u)
		assert.Equal(t, "payments.requested", dest, "units %d", u)
		// One queue a nonzero base-16 digit: the lateness a delay collects grows with them.
		nonzero := 0
		for x := u; x > 0; x >>= delayDigitBits {
			if x&(1<<delayDigitBits-1) != 0 {
				nonzero++
			}
		}
		assert.Equal(t, nonzero, queues, "units %d", u)
	}
}

func TestDelayEntersAtItsHighestLevel(t *testing.T) {
	cases := []struct {
		units uint64
		level string
	}{
		{0, "sluice.delay.d0"},
		{1, "sluice.delay.d0"},
		{15, "sluice.delay.d0"},
		{16, "sluice.delay.d1"},
		{100, "sluice.delay.d1"},
		{4095, "sluice.delay.d2"},
		{4096, "sluice.delay.d3"},
		{1<<DelayLevels - 1, "sluice.delay.d6"},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.units), func(t *testing.T) {
			assert.Equal(t, tc.level, delayEntryExchange(tc.units))
		})
	}
	assert.GreaterOrEqual(t, maxDelay, 7*24*time.Hour, "the cascade reaches at least 7 days")
}

// A delay of up to 40 s waits in at most 3 queues: it has 3 base-16 digits.
func TestDelayUpTo40sCrossesThreeQueues(t *testing.T) {
	const units40s = uint64(40 * time.Second / DelayResolution)
	require.Less(t, units40s, uint64(1)<<(3*delayDigitBits))
	for _, u := range []uint64{0xfff, 0xeee, 0x111} {
		_, queues, _ := simulateCascade(t, delayEntryExchange(u), delayRoutingKey(u, "q"))
		assert.Equal(t, 3, queues, "units %#x", u)
	}
}
