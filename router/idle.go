package router

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Run until idle (Config.StopWhenIdle): a job, or a pod that a scaler such as KEDA's
// starts when the queue holds messages, returns from Run once the work is done, so that it
// can exit. Nothing the stack still owes anyone may be lost by that exit:
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
//   - an abandoned attempt (Config.HandlerTimeout) is not: its message was handed off (its
//     retry copy confirmed) when the stack stopped waiting for it, so the broker has it.
//     Its goroutine may still be running and may still publish outputs and journal its
//     key; Run does not wait for it (it may never return), and reports it as Close does.
//     If it returns after the process exited, its effect (a charge) may have happened with
//     no record of it, and its retry runs it again on the next instance, as after a crash.
//
// The queues are read through the broker's QueueDepth (a passive queue.declare on
// RabbitMQ, which counts ready messages only; the stack's own unacknowledged deliveries
// are its attempts in flight), every idlePoll(StopWhenIdle). A failed read (a lost
// connection) counts as not empty.

// idle counts the stack's attempts in flight for StopWhenIdle; its zero value is ready.
type idle struct {
	inFlight atomic.Int64
	// last is the UnixNano time of the last attempt's start or end.
	last atomic.Int64
}

// track wraps a handler's composed steps so that its attempts count; with StopWhenIdle
// zero the steps are returned as they are and nothing is counted.
func (s *Stack) track(h message.HandlerFunc) message.HandlerFunc {
	if s.cfg.StopWhenIdle <= 0 {
		return h
	}
	return func(m *message.Message) ([]*message.Message, error) {
		s.idle.inFlight.Add(1)
		s.idle.last.Store(time.Now().UnixNano())
		defer func() {
			s.idle.last.Store(time.Now().UnixNano())
			s.idle.inFlight.Add(-1)
		}()
		return h(m)
	}
}

// idlePoll is how often the idle watch reads the consumed queues' depth: a fifth of the
// idle time, at least 100ms and at most 1s.
func idlePoll(stopWhenIdle time.Duration) time.Duration {
	return min(max(stopWhenIdle/5, 100*time.Millisecond), time.Second)
}

// idleRun is one Run's idle watch.
type idleRun struct {
	stop  context.CancelFunc
	done  chan struct{}
	fired atomic.Bool
}

// watchIdle returns the context Run consumes with: with Config.StopWhenIdle, one that also
// ends once the stack has been idle that long, from the moment every handler consumes and
// every idempotency journal is restored. The idleRun's end releases the watch.
func (s *Stack) watchIdle(ctx context.Context) (context.Context, *idleRun) {
	w := &idleRun{done: make(chan struct{})}
	if s.cfg.StopWhenIdle <= 0 {
		w.stop = func() {}
		close(w.done)
		return ctx, w
	}
	runCtx, cancel := context.WithCancel(ctx)
	w.stop = cancel
	go func() {
		defer close(w.done)
		if !s.waitConsuming(runCtx) {
			return
		}
		if s.waitIdle(runCtx) {
			w.fired.Store(true)
			s.logger.Info("router: stopping: the consumed queues were empty and nothing was in flight",
				"stop_when_idle", s.cfg.StopWhenIdle, "queues", len(s.ConsumedQueues()))
			cancel()
		}
	}()
	return runCtx, w
}

// end stops the watch and waits for it. When the watch ended Run, the stack is closed
// as Close does (consumers cancelled, held acks and hand-offs settled, its parts
// released): Run returns nil, or Close's error naming the handlers whose abandoned
// attempts still run. err is Run's own result, returned when it is not nil.
func (w *idleRun) end(s *Stack, err error) error {
	w.stop()
	<-w.done
	if !w.fired.Load() || err != nil {
		return err
	}
	return s.Close()
}

// waitConsuming waits until every handler consumes and every journal is restored; false
// when ctx ended first.
func (s *Stack) waitConsuming(ctx context.Context) bool {
	select {
	case <-s.router.Running():
	case <-ctx.Done():
		return false
	}
	// Run sets restoreDone before it starts the router: it is set by now, or never.
	s.mu.Lock()
	restored := s.restoreDone
	s.mu.Unlock()
	if restored != nil {
		select {
		case <-restored:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// waitIdle polls until the stack has been idle for StopWhenIdle (true) or ctx ends
// (false).
func (s *Stack) waitIdle(ctx context.Context) bool {
	queues := s.ConsumedQueues()
	poll := idlePoll(s.cfg.StopWhenIdle)
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
		if s.idle.inFlight.Load() > 0 || !s.queuesEmpty(ctx, queues, poll) {
			busy = true
			continue
		}
		if busy {
			quietSince, busy = now, false
		}
		if last := time.Unix(0, s.idle.last.Load()); last.After(quietSince) {
			quietSince = last
		}
		if now.Sub(quietSince) >= s.cfg.StopWhenIdle {
			// An attempt may have started since the check above: it counts again.
			if s.idle.inFlight.Load() == 0 {
				return true
			}
			busy = true
		}
	}
}

// queuesEmpty reports whether every queue has no ready message (and no unacknowledged one,
// where the broker says). A failed read is not empty; each read has poll to answer.
func (s *Stack) queuesEmpty(ctx context.Context, queues []string, poll time.Duration) bool {
	for _, q := range queues {
		rctx, cancel := context.WithTimeout(ctx, max(poll, time.Second))
		d, err := s.broker.QueueDepth(rctx, q)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				s.logger.Debug("router: idle watch: read queue depth", "queue", q, "error", err)
			}
			return false
		}
		if d.Ready > 0 || (d.UnackedKnown && d.Unacked > 0) {
			return false
		}
	}
	return true
}

// checkStopWhenIdle refuses a negative StopWhenIdle.
func checkStopWhenIdle(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("router: Config.StopWhenIdle is %s: want 0 (consume until Run's context ends) or a positive idle time", d)
	}
	return nil
}
