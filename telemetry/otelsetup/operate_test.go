package otelsetup_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

// *router.Stack is what Operate watches.
var _ otelsetup.Stack = (*router.Stack)(nil)

// connState is a broker connection whose state the test sets.
type connState struct{ up atomic.Bool }

func (c *connState) Connected() bool   { return c.up.Load() }
func (c *connState) Reconnects() int64 { return 0 }

// Issue 35: /readyz said ready while the breaker had paused the handler, because the
// Health had to be passed to router.Config by hand. After Operate, readiness follows the
// stack's consumption, its breaker pauses and the broker connection, each named in the
// reason.
func TestOperate_ReadinessFollowsConsumptionAndPauses(t *testing.T) {
	clearOTelEnv(t)
	restoreGlobals(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	p, err := otelsetup.Setup(context.Background(), otelsetup.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { shutdown(t, p) })
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	broker := memory.New(memory.Config{Logger: logger})
	t.Cleanup(func() { _ = broker.Close() })
	breakers, err := breaker.New(breaker.Config{ConsecutiveFailures: 2, OpenTimeout: 200 * time.Millisecond, Logger: logger})
	require.NoError(t, err)
	inst, err := p.Instrumentation()
	require.NoError(t, err)
	stack, err := router.New(broker, router.Config{
		Logger: logger, Telemetry: inst, Breakers: breakers,
		Retry: retry.Config{MaxRetries: 50, InitialDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond},
	})
	require.NoError(t, err)
	var down atomic.Bool
	down.Store(true)
	require.NoError(t, stack.Handle("payments", "operate.orders", func(*message.Message) error {
		if down.Load() {
			return errors.New("gateway down")
		}
		return nil
	}, router.WithBreaker("gateway")))

	conn := &connState{}
	conn.up.Store(true)
	ops, err := p.Operate(otelsetup.OperateConfig{Stack: stack, Broker: conn, Instrumentation: inst, Logger: logger})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, ops.Close()) })
	notReady := func() string { return strings.Join(p.Health().NotReady(), "\n") }

	assert.Equal(t, "consumer: not consuming", notReady(), "not ready before Run")
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- stack.Run(ctx) }()
	t.Cleanup(func() { _ = stack.Close() })
	require.Eventually(t, func() bool { return notReady() == "" }, 10*time.Second, 10*time.Millisecond, "ready once consuming: %s", notReady())

	conn.up.Store(false)
	assert.Equal(t, "broker: not connected to the broker", notReady())
	conn.up.Store(true)
	assert.Empty(t, notReady())

	for i := range 4 {
		require.NoError(t, broker.Publisher().Publish("operate.orders", message.NewMessage(string(rune('a'+i)), []byte("x"))))
	}
	require.Eventually(t, func() bool {
		return notReady() == "breaker: handler paused while its breaker is open: payments"
	}, 10*time.Second, 5*time.Millisecond, "not ready while the breaker pauses the handler: %q", notReady())

	down.Store(false)
	require.Eventually(t, func() bool { return notReady() == "" }, 10*time.Second, 10*time.Millisecond,
		"ready again once the breaker closes: %s", notReady())

	cancel()
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	assert.Equal(t, "consumer: not consuming", notReady(), "not ready once the stack stopped")
}
