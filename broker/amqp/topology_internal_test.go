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
// the bindings declareCascade makes, from the given entry exchange, and returns the total
// time the message waits in level queues and the queue it is delivered to.
func simulateCascade(t *testing.T, entry, key string) (time.Duration, string) {
	t.Helper()
	words := strings.Split(key, ".")
	require.Greater(t, len(words), DelayLevels, "key %q", key)
	var level int
	_, err := fmt.Sscanf(entry, topology.DelayExchangePrefix+"%d", &level)
	require.NoError(t, err)
	var waited time.Duration
	for ; level >= 0; level-- {
		switch digit := words[DelayLevels-1-level]; digit {
		case "1": // bound "<*.>^pos 1.#" to the level's queue: wait its TTL, then on
			waited += time.Duration(1<<level) * DelayResolution
		case "0": // bound "<*.>^pos 0.#" to the next exchange
		default:
			t.Fatalf("digit %q at level %d of %q", digit, level, key)
		}
	}
	// The delivery exchange binds "<*.>^DelayLevels Q" for each queue.
	return waited, strings.Join(words[DelayLevels:], ".")
}

func TestCascadeDeliversEveryDelayExactly(t *testing.T) {
	units := []uint64{0, 1, 2, 3, 7, 8, 100, 1000, 12345, 1<<DelayLevels - 1}
	for i := 0; i < 200; i++ {
		units = append(units, rand.Uint64N(1<<DelayLevels))
	}
	for _, u := range units {
		key := delayRoutingKey(u, "payments.requested")
		waited, dest := simulateCascade(t, delayEntryExchange(u), key)
		assert.Equal(t, time.Duration(u)*DelayResolution, waited, "units %d", u)
		assert.Equal(t, "payments.requested", dest, "units %d", u)
	}
}

func TestDelayEntersAtItsHighestLevel(t *testing.T) {
	cases := []struct {
		units uint64
		level string
	}{
		{0, "sluice.delay.00"},
		{1, "sluice.delay.00"},
		{2, "sluice.delay.01"},
		{3, "sluice.delay.01"},
		{100, "sluice.delay.06"},
		{1<<DelayLevels - 1, "sluice.delay.25"},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.units), func(t *testing.T) {
			assert.Equal(t, tc.level, delayEntryExchange(tc.units))
		})
	}
	assert.GreaterOrEqual(t, MaxDelay, 7*24*time.Hour, "the cascade reaches at least 7 days")
}
