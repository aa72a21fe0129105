package otelstep

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
)

// spanContext is a valid span context numbered n.
func spanContext(n int) trace.SpanContext {
	var sid trace.SpanID
	sid[7], sid[6] = byte(n), byte(n>>8)
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: sid, TraceFlags: trace.FlagsSampled})
}

// The rejections remembered are bounded in number and in time, with no goroutine to
// forget them: a service whose retries another instance consumes must not grow.
func TestHeldBackSpans_Bounds(t *testing.T) {
	now := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	key := func(n int) heldBackKey {
		return heldBackKey{queue: "payments", id: "pay-" + strconv.Itoa(n), attempt: 2}
	}

	t.Run("at most heldBackMax, the oldest forgotten first", func(t *testing.T) {
		var h heldBackSpans
		for n := range heldBackMax + 10 {
			h.put(key(n), spanContext(n), time.Second, now)
		}
		assert.Equal(t, int64(heldBackMax), h.n.Load())
		_, ok := h.take(key(9), now)
		assert.False(t, ok, "among the oldest, forgotten")
		sc, ok := h.take(key(heldBackMax+9), now)
		require.True(t, ok, "the newest is remembered")
		assert.Equal(t, spanContext(heldBackMax+9), sc)
	})
	t.Run("taken once", func(t *testing.T) {
		var h heldBackSpans
		h.put(key(1), spanContext(1), time.Second, now)
		_, ok := h.take(key(1), now)
		require.True(t, ok)
		_, ok = h.take(key(1), now)
		assert.False(t, ok, "a second redelivery of the same attempt is not the rejection's")
		assert.Equal(t, int64(0), h.n.Load())
	})
	t.Run("forgotten after its delay and heldBackGrace", func(t *testing.T) {
		var h heldBackSpans
		h.put(key(1), spanContext(1), time.Second, now)
		h.put(key(2), spanContext(2), time.Second, now)
		_, ok := h.take(key(1), now.Add(time.Second+heldBackGrace-time.Millisecond))
		assert.True(t, ok, "within its delay and the grace")
		_, ok = h.take(key(2), now.Add(time.Second+heldBackGrace))
		assert.False(t, ok, "later than its delay and the grace")
		// Expired entries go when a new one is added.
		h.put(key(3), spanContext(3), time.Second, now)
		h.put(key(4), spanContext(4), time.Second, now.Add(time.Hour))
		assert.Equal(t, int64(1), h.n.Load(), "the expired rejection went when a new one came")
	})
	t.Run("taken keys do not grow the order", func(t *testing.T) {
		var h heldBackSpans
		h.put(key(0), spanContext(0), time.Hour, now) // stays, so nothing behind it is popped by age
		for n := 1; n < 3*heldBackMax; n++ {
			h.put(key(n), spanContext(n), time.Hour, now)
			_, ok := h.take(key(n), now)
			require.True(t, ok)
		}
		assert.LessOrEqual(t, len(h.order), 2*heldBackMax)
	})
}
