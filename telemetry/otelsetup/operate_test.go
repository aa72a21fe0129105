package otelsetup_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

// connBroker is the in-memory broker with a connection whose state the test sets, as
// RabbitMQ's broker reports its own.
type connBroker struct {
	*memory.Broker
	up atomic.Bool
}

func (c *connBroker) Connected() bool   { return c.up.Load() }
func (c *connBroker) Reconnects() int64 { return 0 }

// notReady returns why p's /readyz says the process is not ready, one reason a line, or
// "" when it is ready.
func notReady(t *testing.T, p *otelsetup.Providers) string {
	t.Helper()
	rec := httptest.NewRecorder()
	p.Health().ReadinessHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	body := strings.TrimSuffix(rec.Body.String(), "\n")
	if rec.Code == http.StatusOK {
		require.Equal(t, "ready", body)
		return ""
	}
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	return strings.TrimPrefix(body, "not ready\n")
}

// Issue 35: /readyz said ready while the breaker had paused the handler, because the
// Health had to be passed to router.Config by hand. After Operate, readiness follows the
// stack's consumption, its pauses and the broker connection, each named in the reason.
func TestOperate_ReadinessFollowsConsumptionAndPauses(t *testing.T) {
	clearOTelEnv(t)
	restoreGlobals(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := otelsetup.Setup(context.Background(), otelsetup.Config{Logger: logger})
	require.NoError(t, err)
	t.Cleanup(func() { shutdown(t, p) })
	b := &connBroker{Broker: memory.New(memory.Config{Logger: logger})}
	t.Cleanup(func() { _ = b.Close() })
	breakers, err := breaker.New(breaker.Config{ConsecutiveFailures: 2, OpenTimeout: 200 * time.Millisecond, Logger: logger})
	require.NoError(t, err)
	stack, err := router.New(b, router.Config{
		Logger: logger, Telemetry: &telemetry.Config{}, Breakers: breakers,
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

	b.up.Store(true)
	require.NoError(t, p.Operate(stack))

	assert.Equal(t, "consumer: not consuming", notReady(t, p), "not ready before Run")
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- stack.Run(ctx) }()
	t.Cleanup(func() { _ = stack.Close() })
	require.Eventually(t, func() bool { return notReady(t, p) == "" }, 10*time.Second, 10*time.Millisecond, "ready once consuming: %s", notReady(t, p))

	b.up.Store(false)
	assert.Equal(t, "broker: not connected to the broker", notReady(t, p))
	b.up.Store(true)
	assert.Empty(t, notReady(t, p))

	for i := range 4 {
		require.NoError(t, b.Publisher().Publish("operate.orders", message.NewMessage(string(rune('a'+i)), []byte("x"))))
	}
	require.Eventually(t, func() bool {
		return notReady(t, p) == "paused by handler payments: paused: circuit breaker gateway open"
	}, 10*time.Second, 5*time.Millisecond, "not ready while the breaker pauses the handler: %q", notReady(t, p))

	down.Store(false)
	require.Eventually(t, func() bool { return notReady(t, p) == "" }, 10*time.Second, 10*time.Millisecond,
		"ready again once the breaker closes: %s", notReady(t, p))

	cancel()
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	assert.Equal(t, "consumer: not consuming", notReady(t, p), "not ready once the stack stopped")
}

func TestOperate_NeedsAStack(t *testing.T) {
	clearOTelEnv(t)
	restoreGlobals(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	p, err := otelsetup.Setup(context.Background(), otelsetup.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { shutdown(t, p) })
	require.Error(t, p.Operate(nil))
}

func TestSetup_RefusesADepthIntervalBelowTheMinimum(t *testing.T) {
	clearOTelEnv(t)
	restoreGlobals(t)
	_, err := otelsetup.Setup(context.Background(), otelsetup.Config{DepthInterval: 10 * time.Millisecond})
	require.ErrorContains(t, err, "DepthInterval 10ms is below the minimum 500ms")
}

// Run is the quick start's one call: a stack built before it, with the global providers,
// reports to the providers Run installs (even after an earlier Setup in the process, whose
// providers OpenTelemetry's global would keep delegating to), its metrics server serves
// the metrics, readiness and queue depths while it consumes, and it returns once ctx ends.
func TestRun_SetsUpOperatesAndRunsTheStack(t *testing.T) {
	clearOTelEnv(t)
	restoreGlobals(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	// An earlier service in this process: the global providers already delegate to its.
	earlier, err := otelsetup.Setup(context.Background(), otelsetup.Config{})
	require.NoError(t, err)
	shutdown(t, earlier)

	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := memory.New(memory.Config{Logger: logger})
	t.Cleanup(func() { _ = b.Close() })
	stack, err := router.New(b, router.Config{Logger: logger, Telemetry: &telemetry.Config{}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = stack.Close() })
	handled := make(chan struct{}, 1)
	require.NoError(t, stack.Handle("run", "run.orders", func(*message.Message) error {
		handled <- struct{}{}
		return nil
	}))

	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- otelsetup.Run(ctx, stack, otelsetup.Config{ServiceName: "run", MetricsAddr: addr, Logger: logger,
			DepthInterval: 500 * time.Millisecond})
	}()
	require.Eventually(t, func() bool {
		code, _, err := get("http://" + addr + "/readyz")
		return err == nil && code == http.StatusOK
	}, 10*time.Second, 10*time.Millisecond, "ready once the stack consumes")
	require.NoError(t, b.Publisher().Publish("run.orders", message.NewMessage("m-1", []byte("x"))))
	<-handled
	require.Eventually(t, func() bool {
		_, body, err := get("http://" + addr + "/metrics")
		return err == nil && strings.Contains(body, `sluice_messages_total{handler="run"`) &&
			strings.Contains(body, `sluice_queue_depth{kind="dlq",`)
	}, 10*time.Second, 20*time.Millisecond, "the stack's counts and the queue depths on Run's metrics server")

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	_, _, err = get("http://" + addr + "/metrics")
	assert.Error(t, err, "Run shut the metrics server down")
}
