// Package idle tells when a stack run until idle (router.Config.StopWhenIdle) may stop: a
// job, or a pod that a scaler such as KEDA's starts when the queue holds messages, returns
// from Run once the work is done, so that it can exit. Nothing the stack still owes
// anyone may be lost by that exit:
//
//   - an attempt in flight is work: from the moment Watermill hands a delivery to the
//     stack until every step has settled it (its outputs and its retry copy or dead letter
//     confirmed, its journal record appended), the attempt counts, and each attempt's start
//     and end restarts the idle wait;
//   - a message ready in a consumed queue is work, whoever consumes it: a handler paused by
//     its breaker, a partition held by another instance, a delivery given back while the
//     consumer reconnects all keep the stack running;
//   - a message waiting in the delay cascade (sluice.delay.*) or held back by a quorum
//     queue's native delayed retry is not: the broker keeps it and puts it back into the
//     queue on time, where it wakes the next run (RabbitMQ's passive declare does not count
//     a held-back message until its delay is over, measured on 4.3);
//   - an abandoned attempt (router.Config.HandlerTimeout) is not: its message was handed
//     off (its retry copy confirmed) when the stack stopped waiting for it, so the broker
//     has it. Its goroutine may still be running and may still publish outputs and journal
//     its key; Run does not wait for it (it may never return), and reports it as Close
//     does. If it returns after the process exited, its effect (a charge) may have
//     happened with no record of it, and its retry runs it again on the next instance, as
//     after a crash.
//
// The queues are read through the broker's QueueDepth (a passive queue.declare on
// RabbitMQ, which counts ready messages only; the stack's own unacknowledged deliveries
// are its attempts in flight), every Poll(StopWhenIdle). A failed read (a lost
// connection) counts as not empty.
package idle

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
)

// Check refuses a negative StopWhenIdle.
func Check(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("router: Config.StopWhenIdle is %s: want 0 (consume until Run's context ends) or a positive idle time", d)
	}
	return nil
}

// Poll is how often the watch reads the consumed queues' depth: a fifth of the idle
// time, at least 100ms and at most 1s.
func Poll(stopWhenIdle time.Duration) time.Duration {
	return min(max(stopWhenIdle/5, 100*time.Millisecond), time.Second)
}

// Counter counts a stack's attempts in flight; its zero value is ready.
type Counter struct {
	inFlight atomic.Int64
	// last is the UnixNano time of the last attempt's start or end.
	last atomic.Int64
}

// Track wraps a handler's composed steps so that its attempts count.
func (c *Counter) Track(h message.HandlerFunc) message.HandlerFunc {
	return func(m *message.Message) ([]*message.Message, error) {
		c.inFlight.Add(1)
		c.last.Store(time.Now().UnixNano())
		defer func() {
			c.last.Store(time.Now().UnixNano())
			c.inFlight.Add(-1)
		}()
		return h(m)
	}
}

// Watch is what a watch reads of the stack.
type Watch struct {
	// After is how long the stack must be idle; zero or less means no watch.
	After time.Duration
	// Counter counts the attempts in flight.
	Counter *Counter
	// Consuming waits until every handler consumes and every journal is restored; false
	// when ctx ended first.
	Consuming func(ctx context.Context) bool
	// Queues returns the consumed queues.
	Queues func() []string
	// Depth reads a queue's depth (the broker's QueueDepth).
	Depth  func(ctx context.Context, queue string) (sluice.QueueDepth, error)
	Logger *slog.Logger
}

// Run is one Run's idle watch.
type Run struct {
	stop  context.CancelFunc
	done  chan struct{}
	fired atomic.Bool
}

// Start returns the context Run consumes with: with After, one that also ends once the
// stack has been idle that long, from the moment Consuming returns. The Run's End
// releases the watch.
func (w Watch) Start(ctx context.Context) (context.Context, *Run) {
	r := &Run{done: make(chan struct{})}
	if w.After <= 0 {
		r.stop = func() {}
		close(r.done)
		return ctx, r
	}
	runCtx, cancel := context.WithCancel(ctx)
	r.stop = cancel
	go func() {
		defer close(r.done)
		if !w.Consuming(runCtx) {
			return
		}
		queues := w.Queues()
		if w.wait(runCtx, queues) {
			r.fired.Store(true)
			w.Logger.Info("router: stopping: the consumed queues were empty and nothing was in flight",
				"stop_when_idle", w.After, "queues", len(queues))
			cancel()
		}
	}()
	return runCtx, r
}

// End stops the watch and waits for it. When the watch ended Run, the stack is closed
// with closeStack, as Close does (consumers cancelled, held acks and hand-offs settled,
// its parts released), and its result returned: nil, or Close's error naming the handlers
// whose abandoned attempts still run. err is Run's own result, returned when it is not nil.
func (r *Run) End(closeStack func() error, err error) error {
	r.stop()
	<-r.done
	if !r.fired.Load() || err != nil {
		return err
	}
	return closeStack()
}

// wait polls until the stack has been idle for After (true) or ctx ends (false).
func (w Watch) wait(ctx context.Context, queues []string) bool {
	poll := Poll(w.After)
	t := time.NewTicker(poll)
	defer t.Stop()
	// quietSince is when the stack was first seen idle since it was last seen busy: a
	// queue read empty may have emptied any time after the read before, so the idle time
	// runs from the first read that found it empty.
	quietSince, busy := time.Now(), false
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		now := time.Now()
		if w.Counter.inFlight.Load() > 0 || !w.queuesEmpty(ctx, queues, poll) {
			busy = true
			continue
		}
		if busy {
			quietSince, busy = now, false
		}
		if last := time.Unix(0, w.Counter.last.Load()); last.After(quietSince) {
			quietSince = last
		}
		if now.Sub(quietSince) >= w.After {
			// An attempt may have started since the check above: it counts again.
			if w.Counter.inFlight.Load() == 0 {
				return true
			}
			busy = true
		}
	}
}

// queuesEmpty reports whether every queue has no ready message (and no unacknowledged one,
// where the broker says). A failed read is not empty; each read has poll to answer.
func (w Watch) queuesEmpty(ctx context.Context, queues []string, poll time.Duration) bool {
	for _, q := range queues {
		rctx, cancel := context.WithTimeout(ctx, max(poll, time.Second))
		d, err := w.Depth(rctx, q)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.Logger.Debug("router: idle watch: read queue depth", "queue", q, "error", err)
			}
			return false
		}
		if d.Ready > 0 || (d.UnackedKnown && d.Unacked > 0) {
			return false
		}
	}
	return true
}
