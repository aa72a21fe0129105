package router_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/router"
)

// An option whose step the stack does not have used to be ignored (a duplicate order was
// handled three times with WithIdempotencyKey and no Config.Idempotency); it is an error
// at registration now, naming what is missing.
func TestHandle_OptionWithoutItsStepFails(t *testing.T) {
	key := func(*message.Message) (string, error) { return "k", nil }
	guard, err := idempotency.New(idempotency.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = guard.Close() })
	reg, err := breaker.New(breaker.Config{})
	require.NoError(t, err)
	tests := []struct {
		name    string
		cfg     router.Config
		opt     router.HandlerOption
		wantErr error
		wantMsg string
	}{
		{name: "idempotency key without Config.Idempotency", opt: router.WithIdempotencyKey(key), wantErr: router.ErrInvalidOption, wantMsg: "Config.Idempotency is nil"},
		{name: "breaker without Config.Breaker", opt: router.WithBreaker("gateway"), wantErr: router.ErrInvalidOption, wantMsg: `WithBreaker("gateway") but Config.Breaker, Config.Breakers and Config.Retry.Overload are nil`},
		{name: "zero concurrency", opt: router.WithConcurrency(0), wantErr: router.ErrInvalidOption, wantMsg: "WithConcurrency(0)"},
		{name: "negative prefetch", opt: router.WithPrefetch(-1), wantErr: router.ErrInvalidOption, wantMsg: "WithPrefetch(-1)"},
		{name: "idempotency key with its step", cfg: router.Config{Guard: guard}, opt: router.WithIdempotencyKey(key)},
		{name: "breaker with its step", cfg: router.Config{Breakers: reg}, opt: router.WithBreaker("gateway")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Logger = silentLogger
			s, err := router.New(newTestBroker(t), tt.cfg)
			require.NoError(t, err)
			nop := func(*message.Message) error { return nil }
			nopOut := func(*message.Message) ([]*message.Message, error) { return nil, nil }
			errs := []error{
				s.Handle("orders", "orders", nop, tt.opt),
				s.HandleWithOutput("receipts", "receipts", "receipts.out", nopOut, tt.opt),
			}
			for _, err := range errs {
				if tt.wantErr == nil {
					assert.NoError(t, err)
					continue
				}
				assert.ErrorIs(t, err, tt.wantErr)
				assert.ErrorContains(t, err, tt.wantMsg)
			}
		})
	}
}

func TestNew_NilMiddlewareFails(t *testing.T) {
	_, err := router.New(newTestBroker(t), router.Config{Middleware: []message.HandlerMiddleware{nil}})
	assert.ErrorContains(t, err, "Config.Middleware[0] is nil")
}

// Config.Middleware sits inside retry and output confirmation and outside the breaker: its
// failures are retried, the messages it returns are published, and a refusal of its own
// does not count against the dependency. Config.Plugins run with the router.
func TestConfig_MiddlewarePosition(t *testing.T) {
	b := newTestBroker(t)
	reg, err := breaker.New(breaker.Config{ConsecutiveFailures: 1, OpenTimeout: time.Minute})
	require.NoError(t, err)
	var attempts atomic.Int64
	refuseFirst := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if attempts.Add(1) == 1 {
				return nil, errors.New("validation service unavailable")
			}
			out, err := h(msg)
			return append(out, message.NewMessage(watermill.NewUUID(), []byte("audit"))), err
		}
	}
	var pluginRan atomic.Bool
	s, err := router.New(b, router.Config{
		Logger:     silentLogger,
		Retry:      fastRetries(2),
		Breakers:   reg,
		Middleware: []message.HandlerMiddleware{refuseFirst},
		Plugins:    []message.RouterPlugin{func(*message.Router) error { pluginRan.Store(true); return nil }},
	})
	require.NoError(t, err)
	require.NoError(t, s.HandleWithOutput("h", "in", "out", func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("receipt"))}, nil
	}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { _ = s.Close(); cancel(); <-done }) })
	<-s.Running()
	assert.True(t, pluginRan.Load())

	require.NoError(t, b.mem.Publish("in", message.NewMessage(watermill.NewUUID(), []byte("order"))))
	require.Eventually(t, func() bool { return b.mem.Len("out") == 2 }, 10*time.Second, 5*time.Millisecond,
		"retried after the middleware's failure; its own output published beside the handler's")
	assert.Equal(t, int64(2), attempts.Load())
	assert.Equal(t, breaker.StateClosed, reg.State("h"), "the middleware's failure is not the dependency's")
}
