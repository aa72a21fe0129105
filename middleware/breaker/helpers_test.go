package breaker_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/middleware/breaker"
)

var errDown = errors.New("dependency down")

// newRegistry builds a Registry that logs nowhere unless cfg says otherwise.
func newRegistry(t *testing.T, cfg breaker.Config) *breaker.Registry {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	reg, err := breaker.New(cfg)
	require.NoError(t, err)
	return reg
}

// fakeDep is a handler standing for a call to a dependency: it counts calls and returns
// whatever error it is set to.
type fakeDep struct {
	calls atomic.Int64
	mu    sync.Mutex
	err   error
}

func (d *fakeDep) set(err error) {
	d.mu.Lock()
	d.err = err
	d.mu.Unlock()
}

func (d *fakeDep) handle(*message.Message) ([]*message.Message, error) {
	d.calls.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	return nil, d.err
}

func newMsg(ctx context.Context) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte("payload"))
	if ctx != nil {
		msg.SetContext(ctx)
	}
	return msg
}

// trip sends failures through h until the named breaker opens, failing the test if it
// takes more than limit calls.
func trip(t *testing.T, reg *breaker.Registry, name string, h message.HandlerFunc, dep *fakeDep, limit int) {
	t.Helper()
	dep.set(errDown)
	for range limit {
		_, _ = h(newMsg(nil))
		if reg.State(name) == breaker.StateOpen {
			return
		}
	}
	t.Fatalf("breaker %q still %s after %d failures", name, reg.State(name), limit)
}
