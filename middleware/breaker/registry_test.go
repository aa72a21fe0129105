package breaker_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/middleware/breaker"
)

func TestRegistry_SharedBreaker(t *testing.T) {
	reg := newRegistry(t, breaker.Config{ConsecutiveFailures: 2, OpenTimeout: time.Minute})
	require.Same(t, reg.Breaker("gateway"), reg.Breaker("gateway"))
	require.NotSame(t, reg.Breaker("gateway"), reg.Breaker("ledger"))
	assert.Equal(t, "gateway", reg.Breaker("gateway").Name())

	depA, depB, depC := &fakeDep{}, &fakeDep{}, &fakeDep{}
	hA := reg.NewMiddleware("gateway")(depA.handle)
	hB := reg.Breaker("gateway").Middleware(depB.handle)
	hC := reg.NewMiddleware("ledger")(depC.handle)

	depA.set(errDown)
	_, _ = hA(newMsg(nil))
	depB.set(errDown)
	_, _ = hB(newMsg(nil))
	require.Equal(t, breaker.StateOpen, reg.State("gateway"), "failures of both handlers add up")

	for name, h := range map[string]message.HandlerFunc{"A": hA, "B": hB} {
		_, err := h(newMsg(nil))
		assert.ErrorIs(t, err, breaker.ErrOpen, "handler %s", name)
	}
	assert.Equal(t, int64(1), depA.calls.Load())
	assert.Equal(t, int64(1), depB.calls.Load())

	_, err := hC(newMsg(nil))
	assert.NoError(t, err, "another dependency's breaker is independent")
	assert.Equal(t, int64(1), depC.calls.Load())

	assert.Equal(t, map[string]breaker.State{
		"gateway": breaker.StateOpen,
		"ledger":  breaker.StateClosed,
	}, reg.States())
}

func TestRegistry_Names(t *testing.T) {
	tests := []struct {
		name      string
		cfgName   string
		use       func(reg *breaker.Registry) message.HandlerFunc
		wantState string // the breaker that must have opened
	}{
		{name: "Config.Name", cfgName: "gateway", use: func(reg *breaker.Registry) message.HandlerFunc {
			return reg.NewMiddleware("")((&fakeDep{err: errDown}).handle)
		}, wantState: "gateway"},
		{name: "explicit name overrides Config.Name", cfgName: "gateway", use: func(reg *breaker.Registry) message.HandlerFunc {
			return reg.NewMiddleware("ledger")((&fakeDep{err: errDown}).handle)
		}, wantState: "ledger"},
		{name: "no name and no handler name in context", use: func(reg *breaker.Registry) message.HandlerFunc {
			return reg.NewMiddleware("")((&fakeDep{err: errDown}).handle)
		}, wantState: breaker.DefaultName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newRegistry(t, breaker.Config{Name: tt.cfgName, ConsecutiveFailures: 1, OpenTimeout: time.Minute})
			_, _ = tt.use(reg)(newMsg(nil))
			assert.Equal(t, map[string]breaker.State{tt.wantState: breaker.StateOpen}, reg.States())
			assert.Equal(t, breaker.StateOpen, reg.State(tt.wantState))
		})
	}
	t.Run("unknown name is closed and not created", func(t *testing.T) {
		reg := newRegistry(t, breaker.Config{})
		assert.Equal(t, breaker.StateClosed, reg.State("nobody"))
		assert.Empty(t, reg.States())
	})
}

// Under a Watermill router, Registry.Middleware("") names each breaker after its handler.
func TestRegistry_HandlerNameFromRouter(t *testing.T) {
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	defer func() { require.NoError(t, pubSub.Close()) }()
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	require.NoError(t, err)

	reg := newRegistry(t, breaker.Config{ConsecutiveFailures: 2, OpenTimeout: time.Minute})
	type outcome struct {
		handler string
		err     error
	}
	outcomes := make(chan outcome, 10)
	// Stands for the steps above the breaker: record the result and ack, so that a failure
	// does not become a nack and an immediate redelivery.
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			_, err := h(msg)
			outcomes <- outcome{handler: message.HandlerNameFromCtx(msg.Context()), err: err}
			return nil, nil
		}
	}, reg.NewMiddleware(""))

	failing, healthy := &fakeDep{err: errDown}, &fakeDep{}
	noPublish := func(d *fakeDep) message.NoPublishHandlerFunc {
		return func(msg *message.Message) error {
			_, err := d.handle(msg)
			return err
		}
	}
	router.AddConsumerHandler("failing", "in.failing", pubSub, noPublish(failing))
	router.AddConsumerHandler("healthy", "in.healthy", pubSub, noPublish(healthy))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	defer func() {
		require.NoError(t, router.Close())
		require.NoError(t, <-runErr)
	}()
	<-router.Running()

	next := func() outcome {
		t.Helper()
		select {
		case o := <-outcomes:
			return o
		case <-time.After(5 * time.Second):
			t.Fatal("timed out waiting for the handler")
			return outcome{}
		}
	}
	// One at a time: messages in flight together would all find the breaker closed.
	for i, want := range []error{errDown, errDown, breaker.ErrOpen} {
		require.NoError(t, pubSub.Publish("in.failing", message.NewMessage(watermill.NewUUID(), nil)))
		o := next()
		assert.Equal(t, "failing", o.handler)
		assert.ErrorIs(t, o.err, want, "message %d", i)
	}
	require.NoError(t, pubSub.Publish("in.healthy", message.NewMessage(watermill.NewUUID(), nil)))
	o := next()
	assert.Equal(t, "healthy", o.handler)
	assert.NoError(t, o.err)

	assert.Equal(t, int64(2), failing.calls.Load())
	assert.Equal(t, map[string]breaker.State{
		"failing": breaker.StateOpen,
		"healthy": breaker.StateClosed,
	}, reg.States())
}

func TestRegistry_OnStateChange(t *testing.T) {
	type change struct {
		name     string
		from, to breaker.State
		observed breaker.State // what Registry.State said from inside the hook
	}
	var (
		mu      sync.Mutex
		changes []change
		logs    testenv.SyncBuffer
		reg     *breaker.Registry
	)
	const openTimeout = 50 * time.Millisecond
	reg = newRegistry(t, breaker.Config{
		ConsecutiveFailures: 1,
		OpenTimeout:         openTimeout,
		Logger:              slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnStateChange: func(name string, from, to breaker.State) {
			// Calling back into the registry must not deadlock.
			observed := reg.State(name)
			mu.Lock()
			changes = append(changes, change{name: name, from: from, to: to, observed: observed})
			mu.Unlock()
		},
	})
	got := func() []change {
		mu.Lock()
		defer mu.Unlock()
		return append([]change(nil), changes...)
	}

	dep := &fakeDep{}
	h := reg.NewMiddleware("gateway")(dep.handle)
	trip(t, reg, "gateway", h, dep, 1)
	require.Equal(t, []change{{"gateway", breaker.StateClosed, breaker.StateOpen, breaker.StateOpen}}, got())

	// Open turns half-open lazily, when something looks at the breaker.
	require.Eventually(t, func() bool { return reg.State("gateway") == breaker.StateHalfOpen }, 20*openTimeout, openTimeout/10)
	require.Len(t, got(), 2)
	dep.set(nil)
	_, err := h(newMsg(nil))
	require.NoError(t, err)

	assert.Equal(t, []change{
		{"gateway", breaker.StateClosed, breaker.StateOpen, breaker.StateOpen},
		{"gateway", breaker.StateOpen, breaker.StateHalfOpen, breaker.StateHalfOpen},
		{"gateway", breaker.StateHalfOpen, breaker.StateClosed, breaker.StateClosed},
	}, got())

	out := logs.String()
	assert.Contains(t, out, `level=WARN msg="circuit breaker opened; calls are deferred" breaker=gateway from=closed to=open open_timeout=50ms`)
	assert.Contains(t, out, `level=INFO msg="circuit breaker state changed" breaker=gateway from=open to=half-open`)
	assert.Contains(t, out, `level=INFO msg="circuit breaker state changed" breaker=gateway from=half-open to=closed`)
}

// A panicking hook does not stop later state changes from being announced.
func TestRegistry_OnStateChangePanics(t *testing.T) {
	var (
		mu  sync.Mutex
		tos []breaker.State
	)
	reg := newRegistry(t, breaker.Config{
		ConsecutiveFailures: 1,
		OpenTimeout:         20 * time.Millisecond,
		OnStateChange: func(_ string, _, to breaker.State) {
			mu.Lock()
			tos = append(tos, to)
			mu.Unlock()
			if to == breaker.StateOpen {
				panic("hook")
			}
		},
	})
	dep := &fakeDep{}
	dep.set(errDown)
	h := reg.NewMiddleware("dep")(dep.handle)
	assert.PanicsWithValue(t, "hook", func() { _, _ = h(newMsg(nil)) })
	require.Eventually(t, func() bool {
		_ = reg.State("dep")
		mu.Lock()
		defer mu.Unlock()
		return len(tos) == 2 && tos[1] == breaker.StateHalfOpen
	}, time.Second, 5*time.Millisecond)
}

func TestRegistry_DeferralIsReported(t *testing.T) {
	var logs testenv.SyncBuffer
	reg := newRegistry(t, breaker.Config{
		ConsecutiveFailures: 1, OpenTimeout: time.Minute,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	dep := &fakeDep{}
	h := reg.NewMiddleware("dep")(dep.handle)
	trip(t, reg, "dep", h, dep, 1)

	msg := newMsg(nil)
	_, err := h(msg)
	var de *markers.Defer
	require.True(t, errors.As(err, &de))
	assert.Contains(t, logs.String(), "message deferred")
	assert.Contains(t, logs.String(), "message_uuid="+msg.UUID)
}
