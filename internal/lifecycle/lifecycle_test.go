package lifecycle_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/lifecycle"
)

func TestShuttingDown(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithTimeout(context.Background(), -time.Second)
	defer cancel2()
	// Watermill's Timeout over a live consumer context, past its deadline.
	deadlineOverLive, cancel3 := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel3()
	tests := []struct {
		name string
		ctx  context.Context
		want bool
	}{
		{name: "live", ctx: context.Background(), want: false},
		{name: "cancelled: the consumer stops", ctx: cancelled, want: true},
		{name: "past its deadline: the handler failed", ctx: expired, want: false},
		{name: "deadline over a live context", ctx: deadlineOverLive, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, lifecycle.ShuttingDown(tt.ctx))
		})
	}
}

func TestHandoffContext(t *testing.T) {
	t.Run("no deadline: the context itself", func(t *testing.T) {
		ctx := context.WithValue(context.Background(), struct{}{}, "v")
		h, cancel := lifecycle.HandoffContext(ctx)
		defer cancel()
		assert.Equal(t, ctx, h)
	})
	t.Run("an expired deadline is dropped, values kept", func(t *testing.T) {
		type key struct{}
		parent, cancelParent := context.WithTimeout(context.WithValue(context.Background(), key{}, "v"), -time.Second)
		defer cancelParent()
		h, cancel := lifecycle.HandoffContext(parent)
		defer cancel()
		require.NoError(t, h.Err())
		assert.Equal(t, "v", h.Value(key{}))
		dl, ok := h.Deadline()
		require.True(t, ok, "bounded by HandoffTimeout")
		assert.WithinDuration(t, time.Now().Add(lifecycle.HandoffTimeout), dl, time.Second)
	})
	t.Run("a shutdown still cancels the hand-off", func(t *testing.T) {
		parent, cancelParent := context.WithCancel(context.Background())
		withDeadline, cancelDeadline := context.WithTimeout(parent, time.Hour)
		defer cancelDeadline()
		h, cancel := lifecycle.HandoffContext(withDeadline)
		defer cancel()
		cancelParent()
		require.Eventually(t, func() bool { return h.Err() != nil }, 5*time.Second, time.Millisecond)
	})
}
