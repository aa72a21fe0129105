package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/failover"
	"github.com/sluice-go/sluice/internal/amqpurl"
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

	stopCtx context.Context
	stop    context.CancelFunc
	running sync.WaitGroup
}

func newSecondary(cfg config, logger *slog.Logger, newStack func(router.Broker) (*router.Stack, error)) (*secondary, error) {
	c, err := failover.Dial(failover.ClusterConfig{AMQP: amqp.Config{
		URLs: amqpurl.Split(cfg.secondaryURL), Logger: logger, QueueType: amqp.QueueType(cfg.queueType),
	}})
	if err != nil {
		return nil, fmt.Errorf("secondary cluster: %w", err)
	}
	stopCtx, stop := context.WithCancel(context.Background())
	return &secondary{cluster: c, newStack: newStack, logger: logger, stopCtx: stopCtx, stop: stop}, nil
}

// start runs the secondary's consumer in a goroutine until ctx ends or stop; the channel
// receives its result.
func (s *secondary) start(ctx context.Context) <-chan error {
	done := make(chan error, 1)
	s.running.Add(1)
	go func() {
		defer s.running.Done()
		done <- s.run(ctx)
	}()
	return done
}

// run waits for the secondary's first connection, then consumes it. A failure is logged
// and returned; the primary's stack goes on.
func (s *secondary) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.stopCtx, cancel)()
	select {
	case <-s.cluster.Ready():
	case <-ctx.Done():
		return nil
	}
	if ctx.Err() != nil {
		return nil
	}
	stack, err := s.newStack(s.cluster.Broker())
	if err != nil {
		s.logger.Error("payments: cannot consume the secondary cluster", "error", err)
		return fmt.Errorf("secondary cluster: %w", err)
	}
	s.logger.Info("payments: consuming the secondary cluster too")
	// Run returns once ctx is done, in-flight payments finished (Watermill closes the
	// router); Close then releases the stack's metrics.
	err = stack.Run(ctx)
	if cerr := stack.Close(); err == nil {
		err = cerr
	}
	if err != nil && ctx.Err() == nil {
		s.logger.Error("payments: consuming the secondary cluster stopped", "error", err)
		return fmt.Errorf("secondary cluster: %w", err)
	}
	return nil
}

// close stops consuming the secondary, waits for its consumer, and closes the connection.
func (s *secondary) close() error {
	s.stop()
	s.running.Wait()
	return s.cluster.Close()
}
