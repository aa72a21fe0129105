package breaker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/report"
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
	rep := &report.Reporter{}
	msgs, err := h(newMsg(report.WithReporter(spanCtx, rep)))
	span.End()
	require.Len(t, rec.Ended(), 1)
	require.NotEmpty(t, rec.Ended()[0].Events())
	ev := rec.Ended()[0].Events()[0]
	assert.Equal(t, "breaker.returned", ev.Name)
	assert.Contains(t, ev.Attributes, attribute.String("breaker.state", "open"))
	assert.Nil(t, msgs)
	assert.True(t, failure.IsHandoff(err), "the message goes back to its queue: %v", err)
	assert.ErrorIs(t, err, breaker.ErrOpen)
	got, ok := rep.Get()
	require.True(t, ok)
	assert.Equal(t, report.OutcomeNack, got.Outcome)
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
