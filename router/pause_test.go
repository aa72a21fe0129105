package router_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/router"
)

var errDependencyDown = errors.New("dependency down")

// countingDelays counts the hand-offs (retries and deferrals) the stack makes.
type countingDelays struct {
	*testBroker
	n atomic.Int64
}

func (c *countingDelays) Delay(ctx context.Context, queue string, d time.Duration, msg *message.Message) error {
	c.n.Add(1)
	return c.testBroker.Delay(ctx, queue, d, msg)
}

// While the breaker is open a pausing handler takes no deliveries: its messages wait in the
// queue and the dependency sees only the probes; a deferring handler moves every message
// through the delay instead. Both process everything once the dependency is back, and no
// goroutine or timer of the stack outlives Close.
func TestPause_HandlerWaitsWhileTheBreakerIsOpen(t *testing.T) {
	tests := []struct {
		name  string
		opts  []router.HandlerOption
		pause bool
	}{
		{name: "pause", pause: true},
		{name: "defer", opts: []router.HandlerOption{router.WithDeferWhileOpen()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			const messages = 20
			b := &countingDelays{testBroker: newTestBroker(t)}
			reg, err := breaker.New(breaker.Config{ConsecutiveFailures: 2, OpenTimeout: 200 * time.Millisecond, Logger: silentLogger})
			require.NoError(t, err)
			s, err := router.New(b, router.Config{Logger: silentLogger, Breakers: reg, Concurrency: 2, Retry: fastRetries(50)})
			require.NoError(t, err)
			var (
				up    atomic.Bool
				calls atomic.Int64
				mu    sync.Mutex
				done  = map[string]bool{}
			)
			require.NoError(t, s.Handle("charge", "orders", func(msg *message.Message) error {
				calls.Add(1)
				if !up.Load() {
					return errDependencyDown
				}
				mu.Lock()
				done[msg.UUID] = true
				mu.Unlock()
				return nil
			}, append(tt.opts, router.WithBreaker("gateway"))...))
			for i := range messages {
				publish(t, b.testBroker, "orders", fmt.Sprintf("m-%02d", i))
			}
			ctx, cancel := context.WithCancel(context.Background())
			ran := make(chan error, 1)
			go func() { ran <- s.Run(ctx) }()
			<-s.Running()

			time.Sleep(time.Second) // five open periods
			waiting, err := b.mem.QueueDepth(context.Background(), "orders")
			require.NoError(t, err)
			if tt.pause {
				// Two calls trip it, one more may be in flight, then one probe per period.
				assert.LessOrEqual(t, calls.Load(), int64(3+6))
				assert.LessOrEqual(t, b.n.Load(), calls.Load(), "only the failed calls are handed off")
				assert.GreaterOrEqual(t, int(waiting.Ready), messages-int(calls.Load()), "the others wait in the queue")
			} else {
				assert.Greater(t, b.n.Load(), int64(messages), "every message is deferred, again and again")
			}
			up.Store(true)
			require.Eventually(t, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(done) == messages
			}, 10*time.Second, 5*time.Millisecond)
			assert.Equal(t, breaker.StateClosed, reg.State("gateway"))
			require.NoError(t, s.Close())
			cancel()
			require.NoError(t, <-ran)
			require.NoError(t, b.mem.Close())
		})
	}
}
