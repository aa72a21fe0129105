package router_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/testkit/steptest"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// New reads its Config and changes nothing in it: not the step configurations it fills
// defaults and the broker into, not the overload protection it gives the broker's depth.
func TestNew_NeverChangesItsConfig(t *testing.T) {
	o, err := retry.NewOverload(retry.OverloadConfig{BudgetRatio: 0.2})
	require.NoError(t, err)
	observer := &steptest.Observer{} // a pointer: a func would never compare equal
	build := func() router.Config {
		return router.Config{
			Retry:          retry.Config{MaxRetries: 3, InitialDelay: 10 * time.Millisecond, Observer: observer, Overload: o, Host: "worker-1"},
			Concurrency:    2,
			HandlerTimeout: time.Second,
		}
	}
	cfg := build()
	s, err := router.New(newTestBroker(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })

	assert.Equal(t, build(), cfg, "New changed the Config it was given")
	assert.Nil(t, o.Config().Backlog, "the broker's depth is not written into the caller's OverloadConfig")
	assert.Nil(t, cfg.Retry.Delayer)
	assert.Nil(t, cfg.Retry.DeadLetterer)
	// The step in force has the defaults and the broker.
	assert.NotNil(t, s.Retry().Config().Delayer)
	assert.NotNil(t, s.Retry().Config().DeadLetterer)
}
