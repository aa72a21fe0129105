package router_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/policy"
	"github.com/sluice-go/sluice/router"
)

// subscribeRecorder is the embedded broker, recording the options of every subscriber the
// stack asks it for.
type subscribeRecorder struct {
	router.Broker
	mu   sync.Mutex
	opts []broker.SubscribeOptions
}

func (r *subscribeRecorder) Subscriber(o broker.SubscribeOptions) broker.Subscriber {
	r.mu.Lock()
	r.opts = append(r.opts, o)
	r.mu.Unlock()
	return r.Broker.Subscriber(o)
}

// TestSettleBound checks the bound within which the stack settles a handler's deliveries,
// as Describe shows it and as the broker is given it with the subscription:
// ceil(prefetch / concurrency) × (HandlerTimeout + AbandonGrace + 2 × 30 s hand-off) + 10 s.
func TestSettleBound(t *testing.T) {
	batchOf10 := func(s *router.Stack, queue string, opts ...router.HandlerOption) error {
		return s.HandleBatch("h", queue, func(context.Context, []*message.Message) []error { return nil }, opts...)
	}
	tests := []struct {
		name string
		cfg  router.Config
		opts []router.HandlerOption
		// batch registers the handler with HandleBatch instead of Handle.
		batch bool
		// subscribers is how many subscribers the registration makes (its partitions).
		subscribers int
		want        time.Duration
	}{
		{name: "defaults: 30s timeout, 1s grace, one at a time", want: 30*time.Second + time.Second + time.Minute + 10*time.Second},
		{name: "a 4s timeout", cfg: router.Config{HandlerTimeout: 4 * time.Second}, want: 4*time.Second + time.Second + time.Minute + 10*time.Second},
		{name: "a 5s grace", cfg: router.Config{HandlerTimeout: 4 * time.Second, AbandonGrace: 5 * time.Second},
			want: 4*time.Second + 5*time.Second + time.Minute + 10*time.Second},
		{name: "prefetch as deep as the slots: one turn", cfg: router.Config{HandlerTimeout: 4 * time.Second},
			opts: []router.HandlerOption{router.WithConcurrency(4), router.WithPrefetch(4)}, want: 75 * time.Second},
		{name: "prefetch below the slots is raised to them: one turn", cfg: router.Config{HandlerTimeout: 4 * time.Second},
			opts: []router.HandlerOption{router.WithConcurrency(4), router.WithPrefetch(2)}, want: 75 * time.Second},
		{name: "prefetch 10 over 4 slots: three turns", cfg: router.Config{HandlerTimeout: 4 * time.Second},
			opts: []router.HandlerOption{router.WithConcurrency(4), router.WithPrefetch(10)}, want: 3*65*time.Second + 10*time.Second},
		{name: "prefetch 9 over 3 slots: three turns", cfg: router.Config{HandlerTimeout: 4 * time.Second},
			opts: []router.HandlerOption{router.WithConcurrency(3), router.WithPrefetch(9)}, want: 3*65*time.Second + 10*time.Second},
		{name: "the stack's default concurrency and prefetch", cfg: router.Config{HandlerTimeout: 4 * time.Second, Concurrency: 2, Prefetch: 5},
			want: 3*65*time.Second + 10*time.Second},
		{name: "every partition's subscriber", cfg: router.Config{HandlerTimeout: 4 * time.Second},
			opts: []router.HandlerOption{router.WithPartitions(3), router.WithPrefetch(2)}, subscribers: 3, want: 2*65*time.Second + 10*time.Second},
		{name: "a batch of 10 takes 10 slots: one turn", cfg: router.Config{HandlerTimeout: 4 * time.Second},
			opts: []router.HandlerOption{router.WithBatch(10, 0)}, batch: true, want: 75 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem := memory.New(memory.Config{Logger: silentLogger})
			t.Cleanup(func() { _ = mem.Close() })
			rec := &subscribeRecorder{Broker: mem}
			cfg := tc.cfg
			cfg.Logger = silentLogger
			s, err := router.New(rec, cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			queue := uniqueQueue("settle")
			if tc.batch {
				require.NoError(t, batchOf10(s, queue, tc.opts...))
			} else {
				require.NoError(t, s.Handle("h", queue, describedNoop, tc.opts...))
			}

			d := s.Describe()
			require.Len(t, d.Handlers, 1)
			assert.Equal(t, policy.Duration(tc.want), d.Handlers[0].SettleWithin, "Describe's settle bound")
			assert.Contains(t, d.Markdown(), "| Settle bound | every delivery settled within "+policy.Duration(tc.want).String()+" of its delivery")

			rec.mu.Lock()
			defer rec.mu.Unlock()
			want := max(tc.subscribers, 1)
			require.Len(t, rec.opts, want, "one subscriber per consumed queue")
			for i, o := range rec.opts {
				assert.Equal(t, tc.want, o.SettleWithin, "subscriber %d is given the bound", i)
			}
		})
	}
}
