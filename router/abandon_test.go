package router_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/stackview"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
)

// hangingHandler blocks, ignoring its context, on the messages whose payload starts with
// "hang" until release is closed; it counts the calls of every other message.
type hangingHandler struct {
	release chan struct{}
	good    atomic.Int64
	hung    atomic.Int64
	// late is what a hung call returns once released.
	late error
}

func (h *hangingHandler) handle(msg *message.Message) error {
	if strings.HasPrefix(string(msg.Payload), "hang") {
		h.hung.Add(1)
		blockIgnoringContext(h.release)
		return h.late
	}
	h.good.Add(1)
	return nil
}

// blockIgnoringContext is where a hung attempt waits: its record's stack names it.
func blockIgnoringContext(release <-chan struct{}) { <-release }

// TestAbandon_HungAttemptsAreDeadLetteredAndTheRestFlows is issue 52's scenario on the
// embedded broker: HandlerTimeout 200ms, MaxRetries 2, concurrency 4, with 1 and 4 (the
// handler's concurrency) messages that block without looking at their context among 100
// good ones. Every good message is handled, every hung one is dead-lettered after its
// retries with the stuck stack in its record, and Close returns within CloseTimeout.
func TestAbandon_HungAttemptsAreDeadLetteredAndTheRestFlows(t *testing.T) {
	for _, hung := range []int{1, 4} {
		t.Run(fmt.Sprintf("%d hung", hung), func(t *testing.T) {
			b := newTestBroker(t)
			h := &hangingHandler{release: make(chan struct{})}
			stack, err := router.New(b, router.Config{
				Logger: silentLogger, Retry: fastRetries(2), HandlerTimeout: 200 * time.Millisecond,
				AbandonGrace: 100 * time.Millisecond, CloseTimeout: time.Second, Concurrency: 4,
			})
			require.NoError(t, err)
			require.NoError(t, stack.Handle("payments", "payments", h.handle))
			ctx, cancel := context.WithCancel(context.Background())
			ran := make(chan error, 1)
			go func() { ran <- stack.Run(ctx) }()
			<-stack.Running()
			for i := range hung {
				require.NoError(t, b.mem.Publish("payments", message.NewMessage(fmt.Sprintf("hung-%d", i), []byte("hang"))))
			}
			for i := range 100 {
				require.NoError(t, b.mem.Publish("payments", message.NewMessage(fmt.Sprintf("good-%d", i), []byte("ok"))))
			}
			dlq := topology.DLQ("payments")
			require.Eventually(t, func() bool { return h.good.Load() == 100 && b.mem.Len(dlq) == hung }, 20*time.Second, 10*time.Millisecond,
				"good handled %d of 100, dead-lettered %d of %d", h.good.Load(), b.mem.Len(dlq), hung)
			assert.EqualValues(t, 3*hung, h.hung.Load(), "each hung message: its first attempt and 2 retries, each abandoned")
			for _, dead := range b.mem.Peek(dlq) {
				md := dead.Metadata
				assert.Equal(t, "sluice.handler_timeout", md.Get(sluice.HeaderErrorType))
				assert.Contains(t, md.Get(sluice.HeaderErrorMessage), "abandoned after")
				assert.Contains(t, md.Get(sluice.HeaderErrorStack), "blockIgnoringContext", "the record says where the attempt was stuck")
				assert.Equal(t, "2", md.Get(sluice.HeaderRetryCount))
			}

			cancel()
			begin := time.Now()
			require.NoError(t, <-ran)
			err = stack.Close()
			took := time.Since(begin)
			assert.ErrorIs(t, err, sluice.ErrHandlerTimeout, "Close names the handlers still running")
			assert.Contains(t, fmt.Sprint(err), "payments")
			assert.Less(t, took, 3*time.Second, "Run and Close return within CloseTimeout (1s) and the hand-off bound")
			close(h.release) // the user's hung goroutines are the only ones left; they end now
		})
	}
}

// TestAbandon_LateReturn: an abandoned attempt that returns late goes through the steps
// inside the attempt step like any: with idempotency, a late success marks its key done so
// that the retry copy is acked as a duplicate (one effect, one output), and a late failure
// releases it so that the retry runs the handler.
func TestAbandon_LateReturn(t *testing.T) {
	for _, tt := range []struct {
		name         string
		late         error
		wantOutputs  int
		wantDLQ      int
		wantHandlers int64 // calls that did the work
	}{
		{name: "late success: its output once, the retry copy a duplicate", late: nil, wantOutputs: 1, wantDLQ: 0},
		{name: "late failure: the key is released and the retry runs", late: fmt.Errorf("gateway refused"), wantOutputs: 1, wantDLQ: 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := newTestBroker(t)
			guard, err := idempotency.New(idempotency.Config{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = guard.Close() })
			release := make(chan struct{})
			var calls, effects atomic.Int64
			handler := func(msg *message.Message) ([]*message.Message, error) {
				n := calls.Add(1)
				if n == 1 {
					<-release // the first attempt hangs past its timeout, then returns late
					if tt.late != nil {
						return nil, tt.late
					}
				}
				effects.Add(1)
				return []*message.Message{message.NewMessage("out-"+msg.UUID+fmt.Sprint(n), []byte("charged"))}, nil
			}
			retries := fastRetries(5)
			retries.InitialDelay, retries.MaxDelay = 300*time.Millisecond, 300*time.Millisecond
			stack, err := router.New(b, router.Config{
				Logger: silentLogger, Retry: retries, HandlerTimeout: 100 * time.Millisecond,
				AbandonGrace: 50 * time.Millisecond, CloseTimeout: time.Second, Guard: guard,
			})
			require.NoError(t, err)
			require.NoError(t, stack.HandleWithOutput("payments", "payments", "ledger", handler))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _ = stack.Run(ctx) }()
			<-stack.Running()
			require.NoError(t, b.mem.Publish("payments", message.NewMessage("pay-1", []byte("charge"))))
			// Abandoned at ~150ms; its retry copy comes back at ~450ms and finds the key
			// held by the running attempt: a failed attempt, retried again.
			time.Sleep(600 * time.Millisecond)
			assert.EqualValues(t, 1, calls.Load(), "no retry ran the handler beside the abandoned attempt")
			close(release)
			require.Eventually(t, func() bool { return b.mem.Len("ledger") == tt.wantOutputs && b.mem.Len("payments") == 0 },
				10*time.Second, 10*time.Millisecond)
			time.Sleep(800 * time.Millisecond) // any further retry would have come back by now
			assert.Equal(t, tt.wantOutputs, b.mem.Len("ledger"), "outputs")
			assert.EqualValues(t, 1, effects.Load(), "the work was done once")
			assert.Equal(t, tt.wantDLQ, b.mem.Len(topology.DLQ("payments")))
			cancel()
			require.NoError(t, stack.Close())
		})
	}
}

// TestAbandon_BoundPausesTheHandler: at MaxAbandoned abandoned attempts still running the
// handler stops consuming and /readyz names it, until they return.
func TestAbandon_BoundPausesTheHandler(t *testing.T) {
	b := newTestBroker(t)
	h := &hangingHandler{release: make(chan struct{})}
	reader := sdkmetric.NewManualReader()
	inst := &telemetry.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), EventLog: silentLogger}
	retries := fastRetries(5)
	retries.InitialDelay, retries.MaxDelay = time.Hour, time.Hour // the hung ones do not come back
	stack, err := router.New(b, router.Config{
		Logger: silentLogger, Retry: retries, HandlerTimeout: 100 * time.Millisecond, Telemetry: inst,
		AbandonGrace: 50 * time.Millisecond, CloseTimeout: time.Second, Concurrency: 2, MaxAbandoned: 2,
	})
	require.NoError(t, err)
	require.NoError(t, stack.Handle("payments", "payments", h.handle))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = stack.Run(ctx) }()
	<-stack.Running()
	require.NoError(t, b.mem.Publish("payments", message.NewMessage("h1", []byte("hang")), message.NewMessage("h2", []byte("hang"))))
	require.Eventually(t, func() bool { return len(pauseReasons(stack)) > 0 }, 5*time.Second, 5*time.Millisecond)
	reasons := strings.Join(pauseReasons(stack), "\n")
	assert.Contains(t, reasons, "handler payments")
	assert.Contains(t, reasons, "stuck since")
	require.NoError(t, b.mem.Publish("payments", message.NewMessage("g1", []byte("ok"))))
	time.Sleep(300 * time.Millisecond)
	assert.Zero(t, h.good.Load(), "a paused handler takes no message")
	abandoned, running := abandonedMetrics(t, reader)
	assert.EqualValues(t, 2, abandoned, "sluice.handler.abandoned")
	assert.EqualValues(t, 2, running, "sluice.handler.abandoned.running")

	var once sync.Once
	once.Do(func() { close(h.release) })
	require.Eventually(t, func() bool { return h.good.Load() == 1 }, 5*time.Second, 5*time.Millisecond, "resumed once they returned")
	assert.Empty(t, pauseReasons(stack))
	// The handler resumes once one of them returned, below the bound: the other may still
	// be finishing its late return when g1 is handled.
	assert.Eventually(t, func() bool {
		_, running = abandonedMetrics(t, reader)
		return running == 0
	}, 5*time.Second, 5*time.Millisecond, "none still running")
	cancel()
	require.NoError(t, stack.Close())
}

// pauseReasons are the stack's pauses as readiness (otelsetup.Operate) lists them.
func pauseReasons(s *router.Stack) []string {
	v, _ := stackview.Of(s)
	return v.Pauses.Reasons()
}

// abandonedMetrics reads the payments handler's sluice.handler.abandoned counter and
// sluice.handler.abandoned.running gauge.
func abandonedMetrics(t *testing.T, reader *sdkmetric.ManualReader) (abandoned, running int64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name == "sluice.handler.abandoned" {
					for _, p := range data.DataPoints {
						if v, _ := p.Attributes.Value("handler"); v.AsString() == "payments" {
							abandoned += p.Value
						}
					}
				}
			case metricdata.Gauge[int64]:
				if m.Name == "sluice.handler.abandoned.running" {
					for _, p := range data.DataPoints {
						if v, _ := p.Attributes.Value("handler"); v.AsString() == "payments" {
							running += p.Value
						}
					}
				}
			}
		}
	}
	return abandoned, running
}
