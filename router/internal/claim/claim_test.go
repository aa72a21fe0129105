package claim_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/router/internal/claim"
)

// fakeSAC plays RabbitMQ's single active consumer on quorum queues: the first consumer of a
// queue is active, later ones wait, and the consumer count is 1 when anyone consumes.
type fakeSAC struct {
	mu        sync.Mutex
	consumers map[string][]string // queue → instances, in subscription order
}

func (f *fakeSAC) ConsumerCount(_ context.Context, queue string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return min(len(f.consumers[queue]), 1), nil
}

func (f *fakeSAC) subscribe(queue, instance string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.consumers[queue] = append(f.consumers[queue], instance)
}

// active counts, per instance, the partitions it is the active consumer of, and the
// subscriptions it made in all.
func (f *fakeSAC) active() (active, subscribed map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	active, subscribed = map[string]int{}, map[string]int{}
	for _, cs := range f.consumers {
		if len(cs) > 0 {
			active[cs[0]]++
		}
		for _, c := range cs {
			subscribed[c]++
		}
	}
	return active, subscribed
}

// startInstance runs a claimer for one instance and subscribes it to each partition when
// the claimer lets it; the returned channel is closed once every partition is subscribed.
func startInstance(t *testing.T, f *fakeSAC, name string, partitions int, interval time.Duration) <-chan struct{} {
	t.Helper()
	c := claim.New("q", partitions, f, interval, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		c.Close()
	})
	c.Start(ctx)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for k := 0; k < partitions; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-c.Turn(k):
				f.subscribe(topology.Partition("q", k), name)
			case <-ctx.Done():
			}
		}()
	}
	go func() {
		wg.Wait()
		close(done)
	}()
	return done
}

func waitAll(t *testing.T, chans ...<-chan struct{}) {
	t.Helper()
	for _, ch := range chans {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("an instance did not subscribe to every partition")
		}
	}
}

func TestClaimerSharesPartitions(t *testing.T) {
	const interval = 20 * time.Millisecond
	cases := []struct {
		name       string
		partitions int
		instances  int
		stagger    time.Duration // between instance starts
		// wantMin is the fewest partitions each instance must be active on.
		wantMin []int
	}{
		{"one instance takes all", 4, 1, 0, []int{4}},
		{"two started together share", 4, 2, 0, []int{1, 1}},
		{"two started one interval apart share", 4, 2, interval, []int{1, 1}},
		{"three over eight partitions", 8, 3, interval / 2, []int{1, 1, 1}},
		{"a late instance stands by", 4, 2, 40 * interval, []int{4, 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeSAC{consumers: map[string][]string{}}
			var done []<-chan struct{}
			for i := 0; i < tc.instances; i++ {
				if i > 0 {
					time.Sleep(tc.stagger) // the scenario is the start order, not an assertion
				}
				done = append(done, startInstance(t, f, fmt.Sprintf("i%d", i), tc.partitions, interval))
			}
			waitAll(t, done...)
			active, subscribed := f.active()
			total := 0
			for i, want := range tc.wantMin {
				name := fmt.Sprintf("i%d", i)
				assert.GreaterOrEqual(t, active[name], want, "partitions %s is active on (all: %v)", name, active)
				assert.Equal(t, tc.partitions, subscribed[name], "%s subscribes to every partition, as a standby where it is not active", name)
				total += active[name]
			}
			require.Equal(t, tc.partitions, total, "every partition has exactly one active consumer")
		})
	}
}
