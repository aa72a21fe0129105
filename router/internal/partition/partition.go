// Package partition wires a partitioned handler (router.WithPartitions): the names and
// queues of its per-partition handlers, and who consumes which partition — the start-up
// claiming of package claim, or, with router.WithRebalancing, the rebalancing of package
// rebalance with the hand-over of done idempotency keys of package handover.
package partition

import (
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/router/internal/claim"
	"github.com/sluice-go/sluice/router/internal/handover"
	"github.com/sluice-go/sluice/router/internal/rebalance"
)

// Config is one partitioned registration.
type Config struct {
	// Name is the handler's registration name, Queue the queue it consumes as Partitions
	// partitioned queues.
	Name, Queue string
	Partitions  int
	// Rebalance is WithRebalancing, with its Heartbeat.
	Rebalance bool
	Heartbeat time.Duration
	Broker    broker.Broker
	// Keys is the idempotency store whose done keys a rebalanced handler hands over; nil
	// without one.
	Keys   *idempotency.Store
	Logger *slog.Logger
}

// Set is a partitioned registration's partitions.
type Set struct {
	cfg     Config
	claimer *claim.Claimer
	reb     *rebalance.Rebalancer
}

// New returns cfg's partitions. Its error, an option that cannot take effect, names the
// handler.
func New(cfg Config) (*Set, error) {
	if cfg.Partitions < 0 {
		return nil, fmt.Errorf("handler %q has %d partitions, want 1 or more", cfg.Name, cfg.Partitions)
	}
	s := &Set{cfg: cfg}
	if cfg.Rebalance {
		j, ok := cfg.Broker.(broker.Joiner)
		if !ok {
			return nil, fmt.Errorf("handler %q sets WithRebalancing but broker %q keeps no membership", cfg.Name, cfg.Broker.Name())
		}
		var keys rebalance.Handover // nil without an idempotency store
		if cfg.Keys != nil {
			keys = handover.New(cfg.Keys, cfg.Logger)
		}
		s.reb = rebalance.New(cfg.Queue, cfg.Partitions, j, cfg.Heartbeat, keys, cfg.Logger)
	} else if counter, ok := cfg.Broker.(broker.ConsumerCounter); ok {
		s.claimer = claim.New(cfg.Queue, cfg.Partitions, counter, claim.Interval, cfg.Logger)
	}
	return s, nil
}

// HandlerName returns the name of the handler of partition k, "<name>#<k>".
func HandlerName(name string, k int) string { return name + "#" + strconv.Itoa(k) }

// Handler is the handler of one partition.
type Handler struct {
	// K is the partition, Name its handler's name and Queue the queue it consumes.
	K           int
	Name, Queue string
}

// Handlers returns the handler of each partition, in order.
func (s *Set) Handlers() []Handler {
	out := make([]Handler, s.cfg.Partitions)
	for k := range out {
		out[k] = Handler{K: k, Name: HandlerName(s.cfg.Name, k), Queue: topology.Partition(s.cfg.Queue, k)}
	}
	return out
}

// Subscriber returns sub as partition k's handler subscribes with it: once claimed, or
// while rebalancing gives the partition to this instance.
func (s *Set) Subscriber(sub message.Subscriber, k int) message.Subscriber {
	switch {
	case s.reb != nil:
		return s.reb.Subscriber(sub, k, s.cfg.Logger)
	case s.claimer != nil:
		return s.claimer.Subscriber(sub, k, s.cfg.Logger)
	}
	return sub
}

// Held lists the partitions this instance consumes now, sorted, when the set rebalances;
// nil otherwise.
func (s *Set) Held() func() []int {
	if s.reb == nil {
		return nil
	}
	return s.reb.Held
}
