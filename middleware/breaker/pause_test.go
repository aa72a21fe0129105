package breaker_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/middleware/breaker"
)

// ReturningMiddleware gives a rejected message back unacked (a hand-off error, no attempt
// used, nothing deferred) and tells the caller the state; Watch follows the transitions and
// OpenRemaining says when to look again.
func TestBreaker_ReturningMiddleware(t *testing.T) {
	const openTimeout = 200 * time.Millisecond
	reg := newRegistry(t, breaker.Config{ConsecutiveFailures: 1, OpenTimeout: openTimeout, HalfOpenProbes: 1})
	b := reg.Breaker("dep")
	var (
		mu          sync.Mutex
		transitions []string
		returned    []breaker.State
	)
	stop := b.Watch(func(from, to breaker.State) {
		mu.Lock()
		transitions = append(transitions, from.String()+">"+to.String())
		mu.Unlock()
	})
	defer stop()
	dep := &fakeDep{}
	dep.set(errDown)
	h := b.ReturningMiddleware(func(s breaker.State) {
		mu.Lock()
		returned = append(returned, s)
		mu.Unlock()
	})(dep.handle)

	_, err := h(newMsg(nil))
	require.ErrorIs(t, err, errDown)
	require.Equal(t, breaker.StateOpen, b.State())
	assert.InDelta(t, openTimeout, b.OpenRemaining(), float64(50*time.Millisecond))
	assert.Equal(t, openTimeout, b.OpenTimeout())
	assert.Equal(t, 1, b.Probes())

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	spanCtx, span := tp.Tracer("test").Start(context.Background(), "attempt")
	msgs, err := h(newMsg(spanCtx))
	span.End()
	require.Len(t, rec.Ended(), 1)
	require.NotEmpty(t, rec.Ended()[0].Events())
	ev := rec.Ended()[0].Events()[0]
	assert.Equal(t, "breaker.returned", ev.Name)
	assert.Contains(t, ev.Attributes, attribute.String("breaker.state", "open"))
	assert.Nil(t, msgs)
	assert.ErrorIs(t, err, breaker.ErrOpen)
	got := decide.Decide(decide.Input{Err: err})
	assert.Equal(t, disposition.GiveBack, got.Kind, "the message goes back to its queue")
	assert.True(t, got.Unprocessed, "unprocessed: no attempt used, not counted as a failed delivery")
	assert.EqualValues(t, 1, dep.calls.Load(), "the rejected call never reached the dependency")

	require.Eventually(t, func() bool { return b.State() == breaker.StateHalfOpen }, time.Second, 5*time.Millisecond)
	assert.Zero(t, b.OpenRemaining())
	dep.set(nil)
	_, err = h(newMsg(nil))
	require.NoError(t, err)
	assert.Equal(t, breaker.StateClosed, b.State())

	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"closed>open", "open>half-open", "half-open>closed"}, transitions)
	assert.Equal(t, []breaker.State{breaker.StateOpen}, returned)
}

// Issue 33: the opening's log line says what the guarded handlers do: a pausing handler is
// paused, not deferring calls.
func TestBreaker_OpenedLineNamesWhatHandlersDo(t *testing.T) {
	tests := []struct {
		name      string
		pausing   bool
		deferring bool
		want      string
	}{
		{name: "pausing handler", pausing: true, want: `level=WARN msg="circuit breaker opened; handler paused" breaker=dep`},
		{name: "deferring handler", deferring: true, want: `level=WARN msg="circuit breaker opened; calls are deferred" breaker=dep`},
		{name: "both", pausing: true, deferring: true, want: `level=WARN msg="circuit breaker opened; pausing handlers paused, other calls deferred" breaker=dep`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs testenv.SyncBuffer
			reg := newRegistry(t, breaker.Config{ConsecutiveFailures: 1, OpenTimeout: time.Minute,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			b := reg.Breaker("dep")
			dep := &fakeDep{}
			dep.set(errDown)
			var h message.HandlerFunc
			if tt.deferring {
				h = b.Middleware(dep.handle)
			}
			if tt.pausing {
				h = b.ReturningMiddleware(nil)(dep.handle)
			}
			_, _ = h(newMsg(nil))
			require.Equal(t, breaker.StateOpen, b.State())
			assert.Contains(t, logs.String(), tt.want)
		})
	}
}
