// Package claim decides when an instance subscribes to each partition of a partitioned
// queue, by the rule router.WithPartitions states, on a broker that counts consumers
// (broker.ConsumerCounter): the instances started together share the partitions rather
// than the fastest taking them all.
package claim

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/topology"
)

// Interval is how often an instance claims one more free partition; see
// router.WithPartitions.
const Interval = 500 * time.Millisecond

// Claimer decides when this instance subscribes to each partition of one queue, by the
// rule router.WithPartitions states: at once, as a standby, to partitions another instance
// holds; free ones one per interval while it holds no more than the others together. A
// partition left free for claimTimeout is taken whatever the shares, so a miscount (two
// instances claiming the same partition at once, both counting it) cannot leave a
// partition unconsumed.
type Claimer struct {
	queue      string
	partitions int
	counter    broker.ConsumerCounter
	interval   time.Duration
	timeout    time.Duration
	logger     *slog.Logger

	turns []chan struct{} // closed when partition k may be subscribed

	startOnce sync.Once
	stopOnce  sync.Once
	stop      chan struct{}
	wg        sync.WaitGroup
}

// New returns the claimer of queue's partitions, surveying counter every interval (give up
// on a partition's turn after 3 intervals free).
func New(queue string, partitions int, counter broker.ConsumerCounter, interval time.Duration, logger *slog.Logger) *Claimer {
	c := &Claimer{
		queue: queue, partitions: partitions, counter: counter,
		interval: interval, timeout: 3 * interval, logger: logger,
		turns: make([]chan struct{}, partitions), stop: make(chan struct{}),
	}
	for k := range c.turns {
		c.turns[k] = make(chan struct{})
	}
	return c
}

// Turn is closed once partition k may be subscribed to.
func (c *Claimer) Turn(k int) <-chan struct{} { return c.turns[k] }

// Start runs the claim loop, once, until every partition is released, ctx ends or close.
func (c *Claimer) Start(ctx context.Context) {
	c.startOnce.Do(func() {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.run(ctx)
		}()
	})
}

// Close stops the claim loop and waits for it.
func (c *Claimer) Close() {
	c.stopOnce.Do(func() { close(c.stop) })
	c.wg.Wait()
}

func (c *Claimer) run(ctx context.Context) {
	pending := make(map[int]bool, c.partitions)
	for k := 0; k < c.partitions; k++ {
		pending[k] = true
	}
	mine := 0
	var freeSince time.Time
	for {
		held, free, err := c.survey(ctx, pending)
		if err != nil {
			c.logger.Debug("partition survey failed; trying again", "queue", c.queue, "error", err)
		} else {
			for k := range pending {
				if !free[k] {
					// Someone holds it: stand by, to take it over when they go.
					close(c.turns[k])
					delete(pending, k)
				}
			}
			if len(pending) > 0 {
				if freeSince.IsZero() {
					freeSince = time.Now()
				}
				others := held - mine
				if mine == 0 || others <= 0 || mine <= others || time.Since(freeSince) >= c.timeout {
					k := pick(pending)
					c.logger.Debug("claiming partition", "queue", topology.Partition(c.queue, k), "held_here", mine, "held_elsewhere", others)
					close(c.turns[k])
					delete(pending, k)
					mine++
					freeSince = time.Time{}
				}
			}
		}
		if len(pending) == 0 {
			return
		}
		// ±25% so that instances started together do not survey in lockstep.
		wait := c.interval*3/4 + rand.N(c.interval/2+1)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		case <-c.stop:
			t.Stop()
			return
		}
	}
}

// survey counts the partitions that have a consumer (held) and says which pending ones
// have none (free).
func (c *Claimer) survey(ctx context.Context, pending map[int]bool) (held int, free map[int]bool, err error) {
	free = map[int]bool{}
	for k := 0; k < c.partitions; k++ {
		n, err := c.counter.ConsumerCount(ctx, topology.Partition(c.queue, k))
		if err != nil {
			return 0, nil, err
		}
		if n > 0 {
			held++
		} else if pending[k] {
			free[k] = true
		}
	}
	return held, free, nil
}

func pick(set map[int]bool) int {
	keys := make([]int, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	return keys[rand.IntN(len(keys))]
}

// Subscriber returns inner, subscribing to partition k once the claimer lets it.
func (c *Claimer) Subscriber(inner message.Subscriber, k int, logger *slog.Logger) message.Subscriber {
	return &claimedSubscriber{inner: inner, claim: c, k: k, logger: logger, closing: make(chan struct{})}
}

// claimedSubscriber subscribes to partition k once the claimer lets it. Subscribe returns
// at once (Watermill subscribes its handlers one after the other, and Running waits for
// all), and forwards what the partition delivers.
type claimedSubscriber struct {
	inner  message.Subscriber
	claim  *Claimer
	k      int
	logger *slog.Logger

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

func (s *claimedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	out := make(chan *message.Message)
	s.claim.Start(ctx)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		select {
		case <-s.claim.Turn(s.k):
		case <-ctx.Done():
			return
		case <-s.closing:
			return
		}
		for {
			select {
			case <-s.closing:
				return
			default:
			}
			in, err := s.inner.Subscribe(ctx, topic)
			if err == nil {
				// The router reads until out is closed, so this never blocks for good;
				// in closes when the inner subscriber has drained.
				for m := range in {
					out <- m
				}
				return
			}
			s.logger.Warn("subscribe to partition failed; trying again", "queue", topic, "error", err)
			t := time.NewTimer(time.Second)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			case <-s.closing:
				t.Stop()
				return
			}
		}
	}()
	return out, nil
}

// Close stops the claim loop and the partition's subscription, and waits for both.
func (s *claimedSubscriber) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	s.claim.Close()
	err := s.inner.Close()
	s.wg.Wait()
	return err
}
