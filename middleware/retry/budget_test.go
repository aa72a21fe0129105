package retry_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/steptest"
	"github.com/sluice-go/sluice/middleware/retry"
)

// clock is a settable clock shared by the step and its Overload.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// overloadStep builds the retry step (testPolicy) with an Overload on cfg.
func overloadStep(t *testing.T, cfg retry.OverloadConfig) (*retry.Retry, *retry.Overload, *fakeDelayer, *clock) {
	t.Helper()
	c := &clock{t: now}
	cfg.Now = c.Now
	cfg.Logger = slog.New(slog.DiscardHandler)
	o, err := retry.NewOverload(cfg)
	require.NoError(t, err)
	d := &fakeDelayer{}
	pol := testPolicy()
	pol.Delayer = d
	pol.Now = c.Now
	pol.Logger = slog.New(slog.DiscardHandler)
	pol.Overload = o
	observed = &steptest.Observer{}
	pol.Observer = observed
	r, err := newRetry(pol)
	require.NoError(t, err)
	return r, o, d, c
}

// attempt sends one message with the given retry count through the step for dependency
// "gateway" around h, and returns the step's error or, for a message it dead-lettered, the
// dead letter's reason.
func attempt(r *retry.Retry, retries int, h message.HandlerFunc) error {
	msg := message.NewMessage(strconv.Itoa(retries), []byte("x"))
	if retries > 0 {
		msg.Metadata.Set(sluice.HeaderRetryCount, strconv.Itoa(retries))
	}
	msg.SetContext(context.Background())
	if _, err := r.ForDependency("gateway")(h)(msg); err != nil {
		return err
	}
	return deadReason()
}

// deadReason returns the reason of the last attempt observed if it was dead-lettered.
func deadReason() error {
	if rep, ok := observed.Last(); ok && rep.Outcome == disposition.DeadLetter {
		return rep.Err
	}
	return nil
}

func TestOverloadConfig_Validate(t *testing.T) {
	tests := []struct {
		name string
		cfg  retry.OverloadConfig
		ok   bool
	}{
		{name: "zero", ok: true},
		{name: "no budget", cfg: retry.OverloadConfig{BudgetRatio: -1}, ok: true},
		{name: "negative window", cfg: retry.OverloadConfig{Window: -time.Second}},
		{name: "window below a bucket per millisecond", cfg: retry.OverloadConfig{Window: time.Millisecond}},
		{name: "negative concurrency", cfg: retry.OverloadConfig{MaxConcurrentRetries: -1}},
		{name: "negative concurrency delay", cfg: retry.OverloadConfig{ConcurrencyDelay: -time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := retry.NewOverload(tt.cfg)
			if tt.ok {
				assert.NoError(t, err)
			} else {
				assert.Error(t, err)
			}
		})
	}
	o, err := retry.NewOverload(retry.OverloadConfig{})
	require.NoError(t, err)
	assert.Equal(t, retry.DefaultBudgetRatio, o.Config().BudgetRatio)
	assert.Equal(t, retry.DefaultBudgetWindow, o.Config().Window)
	assert.Equal(t, retry.DefaultMinRetriesPerSecond, o.Config().MinRetriesPerSecond)
}

// 100 first attempts fail against a budget of 20%: 20 retries go out with the policy's
// delay; the other 80 wait the policy's cap or, if so configured, go to the dead-letter
// queue as retry_budget_exhausted. None is dropped. The window slides on.
func TestOverload_BudgetCapsRetries(t *testing.T) {
	for _, toDLQ := range []bool{false, true} {
		t.Run(map[bool]string{false: "stretch", true: "dead-letter"}[toDLQ], func(t *testing.T) {
			var refused atomic.Int64
			r, o, d, c := overloadStep(t, retry.OverloadConfig{
				BudgetRatio: 0.2, Window: 10 * time.Second, MinRetriesPerSecond: -1,
				ExhaustedToDLQ: toDLQ,
				OnRefused: func(ev retry.RefusedEvent) {
					assert.Equal(t, retry.RefusedBudget, ev.Reason)
					assert.Equal(t, "gateway", ev.Dependency)
					assert.Equal(t, toDLQ, ev.DeadLettered)
					refused.Add(1)
				},
			})
			var exhausted int
			for range 100 {
				err := attempt(r, 0, failing(errBoom))
				if err != nil {
					require.ErrorIs(t, err, retry.ErrRetryBudgetExhausted)
					assert.Equal(t, "retry_budget_exhausted", sluice.ErrorType(err))
					assert.ErrorIs(t, err, errBoom, "the last error travels with it")
					exhausted++
				}
			}
			var soon, capped int
			for _, call := range d.Calls() {
				switch call.d {
				case 100 * time.Millisecond:
					soon++
				case 10 * time.Second:
					capped++
				default:
					t.Fatalf("unexpected delay %s", call.d)
				}
			}
			assert.Equal(t, 20, soon, "retries within the budget keep the policy's delay")
			if toDLQ {
				assert.Equal(t, 80, exhausted)
				assert.Zero(t, capped)
			} else {
				assert.Zero(t, exhausted)
				assert.Equal(t, 80, capped, "retries past the budget wait the cap")
			}
			assert.EqualValues(t, 80, refused.Load())
			assert.Equal(t, map[string]float64{"gateway": 0}, o.BudgetLeft())

			// The window slides: its old first attempts and retries age out together.
			c.Add(11 * time.Second)
			assert.Equal(t, map[string]float64{"gateway": 0}, o.BudgetLeft())
			for range 10 {
				require.NoError(t, attempt(r, 0, func(*message.Message) ([]*message.Message, error) { return nil, nil }))
			}
			assert.InDelta(t, 2, o.BudgetLeft()["gateway"], 1e-9, "ten new first attempts earn two retries")
		})
	}
}

// Retries past MaxConcurrentRetries against one dependency are deferred without calling
// the handler and without using an attempt; first attempts are not limited.
func TestOverload_ConcurrentRetriesLimited(t *testing.T) {
	r, _, d, _ := overloadStep(t, retry.OverloadConfig{MaxConcurrentRetries: 2, ConcurrencyDelay: 3 * time.Second})
	release := make(chan struct{})
	var inHandler, most atomic.Int64
	blocking := func(*message.Message) ([]*message.Message, error) {
		n := inHandler.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		<-release
		inHandler.Add(-1)
		return nil, nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		retries := 1
		if i >= 5 {
			retries = 0 // three first attempts
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- attempt(r, retries, blocking)
		}()
	}
	require.Eventually(t, func() bool { return len(d.Calls()) == 3 && inHandler.Load() == 5 }, 5*time.Second, time.Millisecond,
		"two retries and three first attempts run, three retries are deferred")
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.EqualValues(t, 5, most.Load())
	for _, call := range d.Calls() {
		assert.Equal(t, 3*time.Second, call.d)
		assert.Equal(t, "1", call.msg.Metadata.Get(headers.DeferCount), "deferred, no attempt used")
		assert.Equal(t, "1", call.msg.Metadata.Get(sluice.HeaderRetryCount))
	}
}

func TestDefaultAdaptive_Adjust(t *testing.T) {
	base := retry.Adjustment{MaxRetries: 5, DelayFactor: 1, MaxDelay: time.Minute}
	tests := []struct {
		name string
		load retry.Load
		want retry.Adjustment
	}{
		{name: "calm", load: retry.Load{FailureRatio: 0.1, Attempts: 100, Backlog: 10}, want: base},
		{name: "too few attempts to judge", load: retry.Load{FailureRatio: 1, Attempts: 9, Backlog: -1}, want: base},
		{name: "elevated failures", load: retry.Load{FailureRatio: 0.3, Attempts: 100, Backlog: -1},
			want: retry.Adjustment{MaxRetries: 4, DelayFactor: 2, MaxDelay: time.Minute}},
		{name: "elevated backlog", load: retry.Load{Attempts: 100, Backlog: 3000},
			want: retry.Adjustment{MaxRetries: 4, DelayFactor: 2, MaxDelay: time.Minute}},
		{name: "high failures", load: retry.Load{FailureRatio: 0.7, Attempts: 100, Backlog: -1},
			want: retry.Adjustment{MaxRetries: 2, DelayFactor: 4, MaxDelay: time.Minute}},
		{name: "high backlog", load: retry.Load{Backlog: 50000},
			want: retry.Adjustment{MaxRetries: 2, DelayFactor: 4, MaxDelay: time.Minute}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, retry.DefaultAdaptive{}.Adjust(tt.load, base))
		})
	}
	low := retry.Adjustment{MaxRetries: 2, DelayFactor: 1, MaxDelay: time.Minute}
	assert.Equal(t, 2, retry.DefaultAdaptive{}.Adjust(retry.Load{FailureRatio: 0.4, Attempts: 100}, low).MaxRetries,
		"elevated pressure never takes a message below two retries")
}

// The step reacts to a load step: while the dependency is healthy a failure gets the
// policy's plan; once most calls fail, the same failure gets fewer retries and longer
// delays, and a message past the trimmed retries goes to the dead-letter queue.
func TestOverload_AdaptivePolicyReactsToALoadStep(t *testing.T) {
	var seen []retry.Load
	var mu sync.Mutex
	policy := retry.AdaptiveFunc(func(load retry.Load, plan retry.Adjustment) retry.Adjustment {
		mu.Lock()
		seen = append(seen, load)
		mu.Unlock()
		return retry.DefaultAdaptive{}.Adjust(load, plan)
	})
	var backlog atomic.Int64
	r, _, d, c := overloadStep(t, retry.OverloadConfig{
		BudgetRatio: -1,
		Policy:      policy,
		Backlog: func(_ context.Context, queue string) (int, error) {
			return int(backlog.Load()), nil
		},
	})
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	for range 50 {
		require.NoError(t, attempt(r, 0, ok))
	}
	require.NoError(t, attempt(r, 1, failing(errBoom)))
	require.Len(t, d.Calls(), 1)
	assert.Equal(t, 200*time.Millisecond, d.Calls()[0].d, "healthy: the policy's delay for retry 2")

	// The step: the dependency fails most calls.
	for range 150 {
		_ = attempt(r, 0, failing(errBoom))
	}
	before := len(d.Calls())
	require.NoError(t, attempt(r, 1, failing(errBoom)))
	calls := d.Calls()
	require.Len(t, calls, before+1)
	assert.Equal(t, 800*time.Millisecond, calls[before].d, "under load: retry 2's delay quadrupled")
	err := attempt(r, 2, failing(errBoom))
	require.ErrorIs(t, err, disposition.ErrRetriesExhausted, "under load: two retries, then the dead-letter queue")

	// Calm again once the failures left the window, until the backlog grows.
	c.Add(11 * time.Second)
	require.NoError(t, attempt(r, 2, failing(errBoom)))
	assert.Equal(t, 400*time.Millisecond, d.Calls()[len(d.Calls())-1].d)
	c.Add(2 * time.Second) // past the backlog reading's refresh
	backlog.Store(8000)
	// The backlog is read for the message's queue, which a Watermill router names.
	gateway := r.ForDependency("gateway")
	res := run(t, gateway, failing(errBoom), message.Metadata{sluice.HeaderRetryCount: "1"})
	require.NoError(t, res.err)
	assert.Equal(t, 800*time.Millisecond, d.Calls()[len(d.Calls())-1].d, "a backlog of 8000 (0.8 of BacklogHigh) quadruples the delay")

	mu.Lock()
	defer mu.Unlock()
	last := seen[len(seen)-1]
	assert.Equal(t, "gateway", last.Dependency)
	assert.Equal(t, queueName, last.Queue)
	assert.Equal(t, 8000, last.Backlog)
	assert.Equal(t, 1, last.InFlight)
	assert.True(t, errors.Is(err, disposition.ErrRetriesExhausted))
}

// A refused retry and an adapted plan are span events on the attempt's span.
func TestOverload_SpanEvents(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	r, _, _, _ := overloadStep(t, retry.OverloadConfig{
		BudgetRatio: 0.01, MinRetriesPerSecond: -1,
		Policy: retry.AdaptiveFunc(func(_ retry.Load, plan retry.Adjustment) retry.Adjustment {
			plan.DelayFactor = 3
			return plan
		}),
	})
	ctx, span := tp.Tracer("test").Start(context.Background(), "attempt")
	msg := message.NewMessage("m-1", []byte("x"))
	msg.SetContext(ctx)
	_, err := r.ForDependency("gateway")(failing(errBoom))(msg)
	span.End()
	require.NoError(t, err, "refused: retried after the cap")

	events := map[string]map[attribute.Key]attribute.Value{}
	for _, e := range rec.Ended()[0].Events() {
		attrs := map[attribute.Key]attribute.Value{}
		for _, a := range e.Attributes {
			attrs[a.Key] = a.Value
		}
		events[e.Name] = attrs
	}
	require.Contains(t, events, "retry.refused")
	assert.Equal(t, "gateway", events["retry.refused"]["sluice.dependency"].AsString())
	assert.Equal(t, retry.RefusedBudget, events["retry.refused"]["sluice.retry.refused_reason"].AsString())
	require.Contains(t, events, "retry.adapted")
	assert.InDelta(t, 3, events["retry.adapted"]["sluice.retry.delay_factor"].AsFloat64(), 1e-9)
}

// Issue 35: a Stack registered a NotifyRefused listener and never removed it, so an
// Overload shared by stacks built and closed in turn called every closed one's. A stopped
// listener is called no more; the others still are.
func TestOverload_NotifyRefusedStop(t *testing.T) {
	r, o, _, _ := overloadStep(t, retry.OverloadConfig{BudgetRatio: 0.2, Window: 10 * time.Second, MinRetriesPerSecond: -1})
	var kept, stopped atomic.Int64
	o.NotifyRefused(func(retry.RefusedEvent) { kept.Add(1) })
	stop := o.NotifyRefused(func(retry.RefusedEvent) { stopped.Add(1) })
	for range 10 {
		_ = attempt(r, 0, failing(errBoom))
	}
	require.Positive(t, kept.Load(), "the budget refused some retries")
	assert.Equal(t, kept.Load(), stopped.Load())
	stop()
	stop() // a second stop removes nothing else
	before := kept.Load()
	for range 10 {
		_ = attempt(r, 0, failing(errBoom))
	}
	assert.Greater(t, kept.Load(), before, "the listener not stopped still hears refusals")
	assert.Equal(t, before, stopped.Load(), "the stopped listener hears nothing more")
}

// Issue 35: the overload protection learns what attempts ended in through the outcome hook
// (Overload.Observe), as telemetry and retry statistics do. Only an acked attempt and a
// retryable failure say something about the dependency; the plan of the next failure reads
// them as its load.
func TestOverload_ObservesOutcomes(t *testing.T) {
	permanent := sluice.Permanent(errBoom)
	tests := []struct {
		name         string
		outcome      disposition.Disposition
		wantAttempts int64
		wantRatio    float64
	}{
		{"ack", disposition.Disposition{Kind: disposition.Ack}, 1, 0},
		{"retry", disposition.Disposition{Kind: disposition.Retry, Reason: errBoom}, 1, 1},
		{"retries exhausted", disposition.Disposition{Kind: disposition.DeadLetter,
			Reason: &decide.ExhaustedError{Retries: 5, Err: errBoom}}, 1, 1},
		{"budget exhausted", disposition.Disposition{Kind: disposition.DeadLetter,
			Reason: &retry.BudgetExhaustedError{Dependency: "gateway", Err: errBoom}}, 1, 1},
		{"permanent", disposition.Disposition{Kind: disposition.DeadLetter, Reason: permanent}, 0, 0},
		{"deferred", disposition.Disposition{Kind: disposition.Defer, Reason: sluice.Defer(time.Second, errBoom)}, 0, 0},
		{"discarded", disposition.Disposition{Kind: disposition.Discard, Reason: sluice.Discard(errBoom)}, 0, 0},
		{"failed hand-off", disposition.Disposition{Kind: disposition.GiveBack, Reason: errors.New("publish nacked")}, 0, 0},
		{"another dependency", disposition.Disposition{Kind: disposition.Retry, Reason: errBoom}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen []retry.Load
			policy := retry.AdaptiveFunc(func(load retry.Load, plan retry.Adjustment) retry.Adjustment {
				seen = append(seen, load)
				return plan
			})
			r, o, _, _ := overloadStep(t, retry.OverloadConfig{BudgetRatio: -1, Policy: policy})
			dep := "gateway"
			if tt.name == "another dependency" {
				dep = "ledger"
			}
			o.Observe(context.Background(), disposition.Outcome{Disposition: tt.outcome, Attempt: 1, Dependency: dep})

			require.NoError(t, attempt(r, 1, failing(errBoom)))
			require.Len(t, seen, 1)
			assert.Equal(t, tt.wantAttempts, seen[0].Attempts, "attempts behind the failure ratio")
			assert.InDelta(t, tt.wantRatio, seen[0].FailureRatio, 1e-9)
		})
	}
}

// A retry whose hand-off fails goes back to the queue and is counted when it is tried again,
// not twice: the failed hand-off's attempt is left out of the failure ratio.
func TestOverload_FailedHandOffNotCounted(t *testing.T) {
	var seen []retry.Load
	policy := retry.AdaptiveFunc(func(load retry.Load, plan retry.Adjustment) retry.Adjustment {
		seen = append(seen, load)
		return plan
	})
	r, _, d, _ := overloadStep(t, retry.OverloadConfig{BudgetRatio: -1, Policy: policy})
	d.err = errors.New("publish nacked")
	require.Error(t, attempt(r, 1, failing(errBoom)))
	d.err = nil
	require.NoError(t, attempt(r, 1, failing(errBoom)))
	require.NoError(t, attempt(r, 1, failing(errBoom)))
	require.Len(t, seen, 3)
	assert.Equal(t, []int64{0, 0, 1}, []int64{seen[0].Attempts, seen[1].Attempts, seen[2].Attempts},
		"only the retry that was handed off counts")
}
