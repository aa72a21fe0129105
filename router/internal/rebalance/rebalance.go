// Package rebalance shares a partitioned handler's partitions fairly among the instances
// that consume it and moves them when an instance joins or leaves, by the rule
// router.WithRebalancing states, on a broker that keeps a membership (broker.Joiner).
package rebalance

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
)

// Assign gives each of partitions to one of members, deterministically from the
// sorted member list, so every instance computes the same. It is rendezvous hashing with
// bounded loads: partition k goes to the member with the highest hash of (queue, k,
// member) that has room, each member having room for floor(P/N) partitions, the first
// P mod N members in sorted order one more; so every member holds floor(P/N) or
// ceil(P/N), and a member joining or leaving mostly moves the partitions it takes or
// leaves.
func Assign(queue string, partitions int, members []string) map[string][]int {
	out := make(map[string][]int, len(members))
	if len(members) == 0 || partitions <= 0 {
		return out
	}
	sorted := slices.Clone(members)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	room := make(map[string]int, len(sorted))
	for i, m := range sorted {
		room[m] = partitions / len(sorted)
		if i < partitions%len(sorted) {
			room[m]++
		}
	}
	for k := 0; k < partitions; k++ {
		ranked := slices.Clone(sorted)
		score := func(m string) uint64 {
			h := fnv.New64a()
			fmt.Fprintf(h, "%s\x00%d\x00%s", queue, k, m)
			return h.Sum64()
		}
		sort.SliceStable(ranked, func(i, j int) bool { return score(ranked[i]) > score(ranked[j]) })
		for _, m := range ranked {
			if room[m] > 0 {
				room[m]--
				out[m] = append(out[m], k)
				break
			}
		}
	}
	return out
}

// errLeft is what a rebalanced handler's join returns once its subscribers closed.
var errLeft = errors.New("router: the handler left its partitions' membership")

// Handover shares what an instance completed with the others when its partitions move
// (package handover's Keys).
type Handover interface {
	// Send broadcasts to m's other members.
	Send(ctx context.Context, m broker.Membership, queue string)
	// Receive takes what another member broadcast.
	Receive(from string, body []byte)
}

// Rebalancer tells the partition subscribers of one handler which partitions are theirs.
type Rebalancer struct {
	queue      string
	partitions int
	joiner     broker.Joiner
	heartbeat  time.Duration
	logger     *slog.Logger
	handover   Handover // nil: nothing handed over

	mu      sync.Mutex
	members broker.Membership
	held    map[int]bool
	closed  bool
}

// join joins the membership once; later calls return at once.
func (r *Rebalancer) join(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.members != nil {
		return nil
	}
	if r.closed {
		return errLeft
	}
	cfg := broker.MembershipConfig{Interval: r.heartbeat}
	if r.handover != nil {
		cfg.OnBroadcast = r.handover.Receive
	}
	m, err := r.joiner.Join(ctx, r.queue, cfg)
	if err != nil {
		return fmt.Errorf("join the members of %q: %w", r.queue, err)
	}
	r.members = m
	return nil
}

// owns says whether partition k is this instance's now, and returns a channel closed at
// the next membership change.
func (r *Rebalancer) owns(k int) (bool, <-chan struct{}) {
	r.mu.Lock()
	m := r.members
	r.mu.Unlock()
	changed := m.Changed() // before Members: a change in between is not missed
	mine := Assign(r.queue, r.partitions, m.Members())[m.ID()]
	return slices.Contains(mine, k), changed
}

func (r *Rebalancer) setHeld(k int, held bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if held {
		r.held[k] = true
	} else {
		delete(r.held, k)
	}
}

// Held lists the partitions consumed here, sorted.
func (r *Rebalancer) Held() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	ks := make([]int, 0, len(r.held))
	for k := range r.held {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// handOver sends this instance's done keys to the others (see keyHandover).
func (r *Rebalancer) handOver(ctx context.Context) {
	r.mu.Lock()
	m := r.members
	r.mu.Unlock()
	if r.handover != nil && m != nil {
		r.handover.Send(ctx, m, r.queue)
	}
}

// close leaves the membership (the others take the partitions over at once).
func (r *Rebalancer) close() {
	r.mu.Lock()
	m, was := r.members, r.closed
	r.closed = true
	r.mu.Unlock()
	if m != nil && !was {
		// Leaving: the others take the partitions over at once, knowing what was done.
		r.handOver(context.Background())
		_ = m.Close()
	}
}

// New returns the rebalancer of queue's partitions, joining joiner's membership with
// heartbeat (zero: 500 ms); a nil handover hands nothing over.
func New(queue string, partitions int, joiner broker.Joiner, heartbeat time.Duration, handover Handover, logger *slog.Logger) *Rebalancer {
	return &Rebalancer{queue: queue, partitions: partitions, joiner: joiner, heartbeat: heartbeat, handover: handover, logger: logger, held: map[int]bool{}}
}

// Subscriber returns inner consuming partition k while the assignment gives it to this
// instance.
func (r *Rebalancer) Subscriber(inner message.Subscriber, k int, logger *slog.Logger) message.Subscriber {
	return &rebalancedSubscriber{inner: inner, reb: r, k: k, logger: logger, closing: make(chan struct{})}
}

// rebalancedSubscriber consumes partition k while the assignment gives it to this
// instance. Subscribe returns at once; the channel it returns stays open across moves.
type rebalancedSubscriber struct {
	inner  message.Subscriber
	reb    *Rebalancer
	k      int
	logger *slog.Logger

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

func (s *rebalancedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		for !s.stopped(ctx) {
			if err := s.reb.join(ctx); err != nil {
				s.logger.Warn("joining the partition members failed; trying again", "queue", topic, "error", err)
				s.pause(ctx, time.Second)
				continue
			}
			own, changed := s.reb.owns(s.k)
			if !own {
				select {
				case <-changed:
				case <-ctx.Done():
				case <-s.closing:
				}
				continue
			}
			s.consume(ctx, topic, out, changed)
		}
	}()
	return out, nil
}

// consume consumes the partition until it is no longer this instance's or the
// subscriber stops, and returns once its consumer is cancelled and what it held settled.
func (s *rebalancedSubscriber) consume(ctx context.Context, topic string, out chan<- *message.Message, changed <-chan struct{}) {
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	in, err := s.inner.Subscribe(subCtx, topic)
	if err != nil {
		s.logger.Warn("subscribe to partition failed; trying again", "queue", topic, "error", err)
		s.pause(ctx, time.Second)
		return
	}
	s.reb.setHeld(s.k, true)
	defer s.reb.setHeld(s.k, false)
	closing := s.closing
	givingUp := false
	for {
		select {
		case m, ok := <-in:
			if !ok {
				if givingUp {
					// The keys of the messages that were in flight at the first hand-over.
					s.reb.handOver(ctx)
				}
				return
			}
			// The router reads out until it is closed, so this does not block for good.
			out <- m
		case <-changed:
			var own bool
			own, changed = s.reb.owns(s.k)
			if !own {
				// Giving up: no new deliveries; in closes once the held ones settled.
				s.logger.Debug("giving partition up", "queue", topic)
				s.reb.setHeld(s.k, false)
				// The new owner takes over once the consumer is cancelled; the keys
				// done here reach it before, or just after, its first deliveries.
				s.reb.handOver(ctx)
				cancel()
				changed, givingUp = nil, true
			}
		case <-closing:
			cancel()
			closing = nil
		}
	}
}

func (s *rebalancedSubscriber) stopped(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	case <-s.closing:
		return true
	default:
		return false
	}
}

func (s *rebalancedSubscriber) pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-s.closing:
	}
}

// Close leaves the membership, stops the partition's subscription and waits for both.
func (s *rebalancedSubscriber) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	s.reb.close()
	err := s.inner.Close()
	s.wg.Wait()
	return err
}
