package breaker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/middleware/breaker"
)

func TestBreaker_Trips(t *testing.T) {
	var (
		F  = errDown
		S  error
		P  = sluice.Permanent(errDown)
		D  = sluice.Discard(errDown)
		Df = sluice.Defer(time.Second, errDown)
		RA = sluice.RetryAfter(time.Second, errDown)
	)
	repeat := func(n int, seq ...error) []error {
		var out []error
		for range n {
			out = append(out, seq...)
		}
		return out
	}
	tests := []struct {
		name   string
		cfg    breaker.Config
		seq    []error
		tripAt int // index of the call after which the breaker is open; -1: never
	}{
		{name: "default waits for min requests", seq: repeat(19, F), tripAt: -1},
		{name: "default trips at half of 20 calls failing", seq: repeat(10, S, F), tripAt: 19},
		{name: "one failure", cfg: breaker.Config{ConsecutiveFailures: 1}, seq: []error{F}, tripAt: 0},
		{name: "three failures", cfg: breaker.Config{ConsecutiveFailures: 3}, seq: repeat(3, F), tripAt: 2},
		{name: "RetryAfter is a failure", cfg: breaker.Config{ConsecutiveFailures: 2}, seq: []error{RA, RA}, tripAt: 1},
		{name: "success resets the streak", cfg: breaker.Config{ConsecutiveFailures: 3}, seq: []error{F, F, S, F, F, F}, tripAt: 5},
		{name: "successes in between never trip", cfg: breaker.Config{ConsecutiveFailures: 3}, seq: repeat(50, F, F, S), tripAt: -1},
		{
			name: "permanent, discard and defer neither fail nor reset the streak",
			cfg:  breaker.Config{ConsecutiveFailures: 3},
			seq:  []error{F, F, P, D, Df, F}, tripAt: 5,
		},
		{
			name: "ratio waits for min requests",
			cfg:  breaker.Config{FailureRatio: 0.5, MinRequests: 10},
			seq:  repeat(9, F), tripAt: -1,
		},
		{
			name: "ratio trips at min requests",
			cfg:  breaker.Config{FailureRatio: 0.5, MinRequests: 10},
			seq:  repeat(10, F), tripAt: 9,
		},
		{
			name: "ratio reached exactly",
			cfg:  breaker.Config{FailureRatio: 0.5, MinRequests: 10},
			seq:  repeat(5, S, F), tripAt: 9,
		},
		{
			name: "ratio below threshold never trips",
			cfg:  breaker.Config{FailureRatio: 0.5, MinRequests: 10},
			seq:  repeat(30, S, S, F), tripAt: -1,
		},
		{
			name: "ratio counts neither permanent nor discard as calls",
			cfg:  breaker.Config{FailureRatio: 0.5, MinRequests: 4},
			// As successes, the Ps would keep the ratio at 3/7 at the end.
			seq: []error{F, P, P, D, F, S, F}, tripAt: 6,
		},
		{
			name: "both set: consecutive trips first",
			cfg:  breaker.Config{ConsecutiveFailures: 3, FailureRatio: 0.9, MinRequests: 100},
			seq:  repeat(3, F), tripAt: 2,
		},
		{
			name: "both set: ratio trips first",
			cfg:  breaker.Config{ConsecutiveFailures: 100, FailureRatio: 0.5, MinRequests: 4},
			seq:  []error{F, S, S, F}, tripAt: 3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.OpenTimeout = time.Minute
			reg := newRegistry(t, tt.cfg)
			dep := &fakeDep{}
			h := reg.NewMiddleware("dep")(dep.handle)

			for i, want := range tt.seq {
				dep.set(want)
				_, err := h(newMsg(nil))
				require.Equal(t, want, err, "call %d: a call let through returns the handler's result", i)
				if i == tt.tripAt {
					require.Equal(t, breaker.StateOpen, reg.State("dep"), "after call %d", i)
					break
				}
				require.Equal(t, breaker.StateClosed, reg.State("dep"), "after call %d", i)
			}

			called := dep.calls.Load()
			_, err := h(newMsg(nil))
			if tt.tripAt < 0 {
				assert.Equal(t, called+1, dep.calls.Load())
				return
			}
			assert.Equal(t, called, dep.calls.Load(), "an open breaker must not call the handler")
			assert.ErrorIs(t, err, breaker.ErrOpen)
		})
	}
}

// One message failing again and again (its retries, a panic on every delivery) is one
// failure: whatever the trip, it cannot open the breaker, while healthy messages pass.
func TestBreaker_OneMessageFailingRepeatedlyCountsOnce(t *testing.T) {
	tests := []struct {
		name string
		cfg  breaker.Config
	}{
		{name: "default"},
		{name: "consecutive", cfg: breaker.Config{ConsecutiveFailures: 3}},
		{name: "ratio", cfg: breaker.Config{FailureRatio: 0.5, MinRequests: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newRegistry(t, tt.cfg)
			poisonMsg := message.NewMessage("poison-1", nil)
			// As in the stack: the handler's panic is an error by the time the breaker sees it.
			h := reg.NewMiddleware("dep")(wmiddleware.Recoverer(func(msg *message.Message) ([]*message.Message, error) {
				if msg.UUID == poisonMsg.UUID {
					panic("boom")
				}
				return nil, nil
			}))
			for i := range 50 {
				_, err := h(poisonMsg.Copy())
				require.Error(t, err)
				if i%10 == 0 {
					_, err = h(newMsg(nil))
					require.NoError(t, err, "healthy message %d", i)
				}
				require.Equal(t, breaker.StateClosed, reg.State("dep"), "after failure %d of one message", i)
			}
		})
	}
}

// Failures that fall out of the rolling window no longer count towards a trip.
func TestBreaker_WindowForgetsOldFailures(t *testing.T) {
	const window = 300 * time.Millisecond
	reg := newRegistry(t, breaker.Config{ConsecutiveFailures: 3, Interval: window, OpenTimeout: time.Minute})
	dep := &fakeDep{}
	dep.set(errDown)
	h := reg.NewMiddleware("dep")(dep.handle)

	for range 2 {
		_, _ = h(newMsg(nil))
	}
	time.Sleep(window + window/2) // let the two failures age out: a precondition, not an assertion
	for range 2 {
		_, _ = h(newMsg(nil))
	}
	assert.Equal(t, breaker.StateClosed, reg.State("dep"))
	_, _ = h(newMsg(nil))
	assert.Equal(t, breaker.StateOpen, reg.State("dep"), "three failures inside the window trip it")
}

func TestBreaker_OpenDefers(t *testing.T) {
	const openTimeout = 300 * time.Millisecond
	tests := []struct {
		name   string
		spread time.Duration
		want   time.Duration // the configured spread after defaults
	}{
		{name: "explicit spread", spread: 40 * time.Millisecond, want: 40 * time.Millisecond},
		{name: "default spread", spread: 0, want: openTimeout / 10},
		{name: "no spread", spread: -1, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newRegistry(t, breaker.Config{ConsecutiveFailures: 1, OpenTimeout: openTimeout, Spread: tt.spread})
			dep := &fakeDep{}
			dep.set(errDown)
			h := reg.NewMiddleware("dep")(dep.handle)

			tripStart := time.Now()
			_, err := h(newMsg(nil))
			tripEnd := time.Now()
			require.ErrorIs(t, err, errDown)
			require.Equal(t, breaker.StateOpen, reg.State("dep"))

			afters := map[time.Duration]bool{}
			for i := range 30 {
				ctx := context.Background()
				callStart := time.Now()
				msgs, err := h(newMsg(ctx))
				callEnd := time.Now()

				require.Nil(t, msgs)
				var de *markers.Defer
				require.ErrorAs(t, err, &de, "call %d", i)
				assert.Equal(t, sluice.ClassDefer, sluice.ClassOf(err))
				assert.ErrorIs(t, err, breaker.ErrOpen)
				assert.ErrorContains(t, err, `"dep" is open`)

				// The breaker opened somewhere in [tripStart, tripEnd] and the remaining
				// time was read somewhere in [callStart, callEnd].
				lo := tripStart.Add(openTimeout).Sub(callEnd)
				hi := tripEnd.Add(openTimeout).Sub(callStart) + tt.want
				assert.GreaterOrEqual(t, de.After, lo, "call %d", i)
				assert.LessOrEqual(t, de.After, hi, "call %d", i)
				afters[de.After] = true
				// The deferral is the breaker's error; the retry step outside decides and
				// observes it (package disposition), no report of the breaker's own.
				assert.Equal(t, disposition.Disposition{Kind: disposition.Defer, Delay: de.After, Reason: err},
					decide.Decide(decide.Input{Err: err, Policy: decide.Policy{MaxTotalAge: time.Hour, MaxRetryAfter: time.Hour}, History: decide.History{Now: time.Now()}}))
			}
			assert.Equal(t, int64(1), dep.calls.Load(), "only the tripping call reaches the dependency")
			if tt.want > 0 {
				assert.Greater(t, len(afters), 1, "deferrals must be spread")
			}
		})
	}
}

// The middleware passes every class of error other than retryable ones through untouched,
// and none of them, at any rate, opens the breaker.
func TestBreaker_ExcludedErrorsNeverOpen(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		err  error
		ctx  context.Context
	}{
		{name: "permanent", err: sluice.Permanent(errDown)},
		{name: "discard", err: sluice.Discard(errDown)},
		{name: "defer from below", err: sluice.Defer(time.Second, errDown)},
		{name: "retryable after the message context was cancelled", err: context.Canceled, ctx: cancelled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newRegistry(t, breaker.Config{ConsecutiveFailures: 2, FailureRatio: 0.1, MinRequests: 2, OpenTimeout: time.Minute})
			dep := &fakeDep{}
			dep.set(tt.err)
			h := reg.NewMiddleware("dep")(dep.handle)

			const n = 1000
			for i := range n {
				_, err := h(newMsg(tt.ctx))
				require.Same(t, tt.err, err, "call %d", i)
			}
			assert.Equal(t, int64(n), dep.calls.Load())
			assert.Equal(t, breaker.StateClosed, reg.State("dep"))
		})
	}
}

func TestBreaker_HalfOpen(t *testing.T) {
	const openTimeout = 50 * time.Millisecond
	tests := []struct {
		name      string
		probes    int
		results   []error // results of successive probes
		wantAfter []breaker.State
	}{
		{name: "probe succeeds and closes", probes: 1, results: []error{nil}, wantAfter: []breaker.State{breaker.StateClosed}},
		{name: "probe fails and re-opens", probes: 1, results: []error{errDown}, wantAfter: []breaker.State{breaker.StateOpen}},
		{
			name: "permanent probe says nothing: the next message probes", probes: 1,
			results:   []error{sluice.Permanent(errDown), nil},
			wantAfter: []breaker.State{breaker.StateHalfOpen, breaker.StateClosed},
		},
		{
			name: "two probes must both succeed", probes: 2,
			results:   []error{nil, nil},
			wantAfter: []breaker.State{breaker.StateHalfOpen, breaker.StateClosed},
		},
		{
			name: "second of two probes fails", probes: 2,
			results:   []error{nil, errDown},
			wantAfter: []breaker.State{breaker.StateHalfOpen, breaker.StateOpen},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newRegistry(t, breaker.Config{ConsecutiveFailures: 1, OpenTimeout: openTimeout, HalfOpenProbes: tt.probes, Spread: -1})
			dep := &fakeDep{}
			h := reg.NewMiddleware("dep")(dep.handle)
			trip(t, reg, "dep", h, dep, 1)

			require.Eventually(t, func() bool { return reg.State("dep") == breaker.StateHalfOpen },
				20*openTimeout, openTimeout/10)

			var probeStart time.Time
			for i, res := range tt.results {
				dep.set(res)
				probeStart = time.Now()
				called := dep.calls.Load()
				_, err := h(newMsg(nil))
				require.Equal(t, called+1, dep.calls.Load(), "probe %d must reach the dependency", i)
				require.Equal(t, res, err)
				require.Equal(t, tt.wantAfter[i], reg.State("dep"), "after probe %d", i)
			}

			final := tt.wantAfter[len(tt.wantAfter)-1]
			called := dep.calls.Load()
			dep.set(nil)
			_, err := h(newMsg(nil))
			switch final {
			case breaker.StateClosed:
				require.NoError(t, err)
				assert.Equal(t, called+1, dep.calls.Load())
			case breaker.StateOpen:
				var de *markers.Defer
				require.ErrorAs(t, err, &de)
				assert.Equal(t, called, dep.calls.Load())
				// Re-opened by the last probe: a fresh open timeout, less the time since.
				assert.LessOrEqual(t, de.After, openTimeout)
				assert.GreaterOrEqual(t, de.After, openTimeout-time.Since(probeStart))
			}
		})
	}
}

// While the half-open probes are in flight, further messages are deferred by a whole open
// timeout rather than piling onto a dependency that may still be down.
func TestBreaker_HalfOpenRejectsBeyondProbes(t *testing.T) {
	const openTimeout = 50 * time.Millisecond
	reg := newRegistry(t, breaker.Config{ConsecutiveFailures: 1, OpenTimeout: openTimeout, Spread: 5 * time.Millisecond})
	dep := &fakeDep{}
	trip(t, reg, "dep", reg.NewMiddleware("dep")(dep.handle), dep, 1)
	require.Eventually(t, func() bool { return reg.State("dep") == breaker.StateHalfOpen },
		20*openTimeout, openTimeout/10)

	entered, release := make(chan struct{}), make(chan struct{})
	h := reg.NewMiddleware("dep")(func(msg *message.Message) ([]*message.Message, error) {
		close(entered)
		<-release
		return nil, nil
	})
	probeErr := make(chan error, 1)
	go func() {
		_, err := h(newMsg(nil))
		probeErr <- err
	}()
	<-entered

	_, err := h(newMsg(nil))
	var de *markers.Defer
	require.ErrorAs(t, err, &de)
	assert.ErrorIs(t, err, breaker.ErrOpen)
	assert.ErrorContains(t, err, "half-open")
	assert.GreaterOrEqual(t, de.After, openTimeout)
	assert.Less(t, de.After, openTimeout+5*time.Millisecond)

	close(release)
	require.NoError(t, <-probeErr)
	assert.Equal(t, breaker.StateClosed, reg.State("dep"))
}

func TestBreaker_Fallback(t *testing.T) {
	out := message.NewMessage("fallback-out", []byte("cached"))
	errFallback := errors.New("fallback failed")
	tests := []struct {
		name     string
		fallback func(*message.Message, error) ([]*message.Message, error)
		wantMsgs []*message.Message
		wantErr  error
	}{
		{
			name:     "result replaces the deferral",
			fallback: func(*message.Message, error) ([]*message.Message, error) { return []*message.Message{out}, nil },
			wantMsgs: []*message.Message{out},
		},
		{
			name:     "error passes through",
			fallback: func(*message.Message, error) ([]*message.Message, error) { return nil, errFallback },
			wantErr:  errFallback,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var (
				gotMsg *message.Message
				gotErr error
				calls  int
			)
			reg := newRegistry(t, breaker.Config{
				ConsecutiveFailures: 1,
				OpenTimeout:         time.Minute,
				Fallback: func(msg *message.Message, err error) ([]*message.Message, error) {
					calls++
					gotMsg, gotErr = msg, err
					return tt.fallback(msg, err)
				},
			})
			dep := &fakeDep{}
			h := reg.NewMiddleware("dep")(dep.handle)
			trip(t, reg, "dep", h, dep, 1)
			require.Zero(t, calls, "fallback is not for failures the breaker let through")

			msg := newMsg(context.Background())
			msgs, err := h(msg)

			assert.Equal(t, tt.wantMsgs, msgs)
			assert.Equal(t, tt.wantErr, err)
			assert.Equal(t, 1, calls)
			assert.Same(t, msg, gotMsg)
			assert.ErrorIs(t, gotErr, breaker.ErrOpen)
			assert.Equal(t, int64(1), dep.calls.Load(), "handler not called while open")
			assert.NotEqual(t, sluice.ClassDefer, sluice.ClassOf(err), "a fallback is not a deferral")
		})
	}
}

func TestBreaker_SpanEvents(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	tracer := tp.Tracer("test")

	reg := newRegistry(t, breaker.Config{ConsecutiveFailures: 1, OpenTimeout: time.Minute, Spread: -1})
	dep := &fakeDep{}
	dep.set(errDown)
	h := reg.NewMiddleware("gateway")(dep.handle)

	attempt := func(name string) {
		ctx, span := tracer.Start(context.Background(), name)
		_, _ = h(newMsg(ctx))
		span.End()
	}
	attempt("tripping")
	attempt("deferred")

	spans := rec.Ended()
	require.Len(t, spans, 2)
	events := func(i int) map[string]map[attribute.Key]attribute.Value {
		out := map[string]map[attribute.Key]attribute.Value{}
		for _, e := range spans[i].Events() {
			attrs := map[attribute.Key]attribute.Value{}
			for _, a := range e.Attributes {
				attrs[a.Key] = a.Value
			}
			out[e.Name] = attrs
		}
		return out
	}

	tripping := events(0)
	require.Contains(t, tripping, "breaker.open")
	assert.Equal(t, "gateway", tripping["breaker.open"]["breaker.name"].AsString())
	assert.Equal(t, "closed", tripping["breaker.open"]["breaker.from"].AsString())
	assert.Equal(t, "open", tripping["breaker.open"]["breaker.to"].AsString())
	assert.NotContains(t, tripping, "breaker.deferred")

	deferred := events(1)
	require.Contains(t, deferred, "breaker.deferred")
	assert.Equal(t, "gateway", deferred["breaker.deferred"]["breaker.name"].AsString())
	assert.Equal(t, "open", deferred["breaker.deferred"]["breaker.state"].AsString())
	assert.InDelta(t, time.Minute.Milliseconds(), deferred["breaker.deferred"]["breaker.delay_ms"].AsInt64(), 1000)
	assert.NotContains(t, deferred, "breaker.open")
}

// A panic in the handler counts as a failure and still reaches the recoverer above.
func TestBreaker_PanicIsAFailure(t *testing.T) {
	reg := newRegistry(t, breaker.Config{ConsecutiveFailures: 1, OpenTimeout: time.Minute})
	h := reg.NewMiddleware("dep")(func(*message.Message) ([]*message.Message, error) { panic("boom") })
	assert.PanicsWithValue(t, "boom", func() { _, _ = h(newMsg(nil)) })
	assert.Equal(t, breaker.StateOpen, reg.State("dep"))
}

// Concurrent calls, state reads and transitions race on nothing (run with -race).
func TestBreaker_Concurrent(t *testing.T) {
	reg := newRegistry(t, breaker.Config{ConsecutiveFailures: 3, OpenTimeout: 5 * time.Millisecond, HalfOpenProbes: 2})
	dep := &fakeDep{}
	h := reg.NewMiddleware("dep")(dep.handle)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 300 {
				if g == 0 && i%50 == 0 {
					if i%100 == 0 {
						dep.set(errDown)
					} else {
						dep.set(nil)
					}
				}
				_, err := h(newMsg(nil))
				if err != nil && !errors.Is(err, errDown) && !errors.Is(err, breaker.ErrOpen) {
					t.Errorf("unexpected error %v", err)
				}
				_ = reg.States()
			}
		})
	}
	wg.Wait()
}
