package attempt

import (
	"context"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Attempts run on pooled goroutines. A fresh goroutine per attempt grew its stack through
// the whole chain of steps inside this one on every message (runtime.copystack was some 4%
// of a consumer's CPU, issue 55); a worker keeps the stack it grew.
const (
	// maxIdleWorkers bounds the goroutines kept waiting for an attempt.
	maxIdleWorkers = 128
	// workerIdle is how long a worker waits for its next attempt before it ends.
	workerIdle = 10 * time.Second
)

// job is one attempt for a worker.
type job struct {
	st      *State
	h       message.HandlerFunc
	hm      *message.Message
	handler string
	done    chan<- result
}

// worker is a goroutine that runs attempts one after the other. jobs holds at most the
// one it is given; closed, it ends the worker.
type worker struct {
	jobs  chan job
	ended chan struct{}
}

// pool holds a step's idle workers. The zero value is an open, empty pool.
type pool struct {
	mu     sync.Mutex
	idle   []*worker
	closed bool
}

// dispatch runs j on an idle worker, or a new one. Once the step is closed every attempt
// gets a goroutine of its own that ends with it.
func (s *Step) dispatch(j job) {
	p := &s.workers
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		w.jobs <- j // taken out of idle under the lock: nobody else sends, nobody closes
		return
	}
	closed := p.closed
	p.mu.Unlock()
	if closed {
		go s.run(j)
		return
	}
	w := &worker{jobs: make(chan job, 1), ended: make(chan struct{})}
	w.jobs <- j
	go s.work(w)
}

// work runs w's attempts until it has waited workerIdle for one, or the step closed.
func (s *Step) work(w *worker) {
	defer close(w.ended)
	timer := time.NewTimer(workerIdle)
	defer timer.Stop()
	j, ok := <-w.jobs
	for ok {
		s.run(j)
		// A handler that started goroutines left them this attempt's labels; the worker
		// itself carries none while it waits.
		pprof.SetGoroutineLabels(context.Background())
		if !s.workers.park(w) {
			return
		}
		timer.Reset(workerIdle)
		select {
		case j, ok = <-w.jobs:
		case <-timer.C:
			if s.workers.leave(w) {
				return
			}
			// A dispatch (or Close) took w out of idle just now: its attempt (or the
			// close) is on the way.
			j, ok = <-w.jobs
		}
	}
}

// park puts w back among the idle workers; false means w should end (closed, or enough
// idle already).
func (p *pool) park(w *worker) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= maxIdleWorkers {
		return false
	}
	p.idle = append(p.idle, w)
	return true
}

// leave takes w out of the idle workers, reporting whether it was there.
func (p *pool) leave(w *worker) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.idle {
		if x == w {
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			return true
		}
	}
	return false
}

// Close ends the idle workers and waits for them; a worker running an attempt ends when
// the attempt returns (an abandoned one, when its handler does). Attempts after Close run
// on goroutines of their own. Close is idempotent.
func (s *Step) Close() {
	p := &s.workers
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, w := range idle {
		close(w.jobs)
	}
	for _, w := range idle {
		<-w.ended
	}
}

// timers reuses the attempts' timers: Reset and Stop leave no stale tick behind (Go 1.23).
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}
