package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/failover"
	"github.com/sluice-go/sluice/router"
)

// secondary consumes the second cluster AMQP_SECONDARY_URL names, where the producers
// publish while no primary node can be reached: the clusters do not copy messages to each
// other, so what was published there is settled there. It connects in the background, so
// the service starts (and consumes the primary) whether or not the secondary is reachable,
// and runs its stack once connected.
type secondary struct {
	cluster  *failover.Cluster
	newStack func(router.Broker) (*router.Stack, error)
	logger   *slog.Logger

	mu      sync.Mutex
	stack   *router.Stack
	stopped bool
	stopCh  chan struct{}
	once    sync.Once
}

func newSecondary(cfg config, logger *slog.Logger, newStack func(router.Broker) (*router.Stack, error)) (*secondary, error) {
	c, err := failover.Dial(failover.ClusterConfig{AMQP: amqp.Config{
		URLs: amqp.SplitURLs(cfg.secondaryURL), Logger: logger, QueueType: amqp.QueueType(cfg.queueType),
	}})
	if err != nil {
		return nil, fmt.Errorf("secondary cluster: %w", err)
	}
	return &secondary{cluster: c, newStack: newStack, logger: logger, stopCh: make(chan struct{})}, nil
}

// run waits for the secondary's first connection, then consumes it until ctx ends or
// stop. A failure is logged and returned; the primary's stack goes on.
func (s *secondary) run(ctx context.Context) error {
	select {
	case <-s.cluster.Ready():
	case <-ctx.Done():
		return nil
	case <-s.stopCh:
		return nil
	}
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	stack, err := s.newStack(router.FromAMQP(s.cluster.Broker()))
	if err != nil {
		s.mu.Unlock()
		s.logger.Error("payments: cannot consume the secondary cluster", "error", err)
		return fmt.Errorf("secondary cluster: %w", err)
	}
	s.stack = stack
	s.mu.Unlock()
	s.logger.Info("payments: consuming the secondary cluster too")
	if err := stack.Run(ctx); err != nil {
		s.logger.Error("payments: consuming the secondary cluster stopped", "error", err)
		return fmt.Errorf("secondary cluster: %w", err)
	}
	return nil
}

// stop stops consuming the secondary (in-flight payments finish); run returns.
func (s *secondary) stop() error {
	var err error
	s.once.Do(func() {
		close(s.stopCh)
		s.mu.Lock()
		s.stopped = true
		stack := s.stack
		s.mu.Unlock()
		if stack != nil {
			err = stack.Close()
		}
	})
	return err
}

// close stops consuming and closes the connection to the secondary.
func (s *secondary) close() error {
	err := s.stop()
	if cerr := s.cluster.Close(); err == nil {
		err = cerr
	}
	return err
}
