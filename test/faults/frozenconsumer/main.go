// Command frozenconsumer is the fault suite's consumer in a process of its own, for the
// frozen-consumer scenario (test/faults, TestFrozen): the test stops it with SIGSTOP and
// resumes it with SIGCONT, which it cannot do to itself. It runs a sluice stack on one
// queue with an idempotency step of its own and writes "effect <message id>" to stdout
// for every side effect (a successful handler call), and "running" once it consumes; it
// logs to stderr and stops cleanly on SIGTERM. The suite builds it into a temporary
// directory; it is not meant for anything else.
//
//	frozenconsumer -url amqp://... -queue q [-concurrency 4] [-prefetch 16] [-work 50ms]
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "frozenconsumer:", err)
		os.Exit(1)
	}
}

func run() error {
	url := flag.String("url", "", "AMQP URL of the node")
	queue := flag.String("queue", "", "queue to consume")
	concurrency := flag.Int("concurrency", 4, "messages handled at once")
	prefetch := flag.Int("prefetch", 16, "prefetch count")
	work := flag.Duration("work", 50*time.Millisecond, "how long a handler call takes")
	flag.Parse()
	if *url == "" || *queue == "" {
		return errors.New("-url and -queue are required")
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	var outMu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	say := func(line string) {
		outMu.Lock()
		defer outMu.Unlock()
		_, _ = out.WriteString(line + "\n")
		_ = out.Flush()
	}

	dial, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	b, err := amqp.New(dial, amqp.Config{URLs: []string{*url}, Logger: logger, ReconnectMaxInterval: time.Second})
	if err != nil {
		return err
	}
	defer b.Close()
	guard, err := idempotency.New(idempotency.Config{})
	if err != nil {
		return err
	}
	defer guard.Close()
	// The retry policy is the suite's (test/faults retryConfig): the delay cascade both
	// consumers of the queue declare must match.
	s, err := router.New(b, router.Config{
		Logger:      logger,
		Retry:       retry.Config{MaxRetries: 3, InitialDelay: 2 * time.Second, Multiplier: 1, Jitter: -1},
		Guard:       guard,
		Concurrency: *concurrency,
		Prefetch:    *prefetch,
	})
	if err != nil {
		return err
	}
	h := func(m *message.Message) error {
		select {
		case <-time.After(*work):
		case <-m.Context().Done():
			return m.Context().Err()
		}
		say("effect " + m.UUID)
		return nil
	}
	if err := s.Handle("faults-"+*queue, *queue, h); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Running():
		say("running")
	case err := <-done:
		return fmt.Errorf("stack stopped at start: %w", err)
	}
	err = <-done
	if cerr := s.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}
