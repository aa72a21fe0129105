// Package attempt runs each delivery attempt of a handler on a goroutine of its own and
// stops waiting for it at the handler timeout plus a grace, whether or not the handler
// returns. Go cannot stop a goroutine, so sluice stops waiting: the attempt is abandoned,
// the step returns a retryable failure (*Abandoned, error type sluice.handler_timeout)
// that says how long the attempt had run and where it was stuck, and the retry step
// outside hands the message off like any other failure, then acks it. The handler's slot
// is free again.
//
// The abandoned goroutine goes on. Everything inside this step runs on it (idempotency,
// output confirmation, the user's middleware, the breaker, the handler), so when the
// handler returns late its result goes through the same steps as any attempt's: a late
// success publishes its outputs once, confirmed, and marks its idempotency key done; a
// late failure releases the key. While it runs, the idempotency step holds the key
// (State.Track), so a retry copy of the same key does not run the handler beside it.
//
// A Tracker counts each handler's abandoned attempts still running and reports when they
// reach the handler's bound, which pauses the handler (router) and makes the process not
// ready. When the stack closes (Config.Cut), every attempt still running is abandoned as
// well, and its message is given back to its queue unacked.
package attempt

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/internal/panics"
)

// ErrorType is the error type of an abandoned attempt, in failure records, metrics and
// spans.
const ErrorType = "sluice.handler_timeout"

// maxStackBytes bounds the stack an abandoned attempt's record keeps, as a panic's is.
const maxStackBytes = 16 << 10

// Defaults of Config's zero fields.
const (
	// DefaultGrace is how long past the handler timeout an attempt may still return.
	DefaultGrace = time.Second
	// DefaultMaxAbandoned is how many abandoned attempts of one handler may still run
	// before the handler pauses.
	DefaultMaxAbandoned = 16
)

// Abandoned is the failure of an attempt the stack stopped waiting for. It is retryable;
// errors.Is matches it with sluice.ErrHandlerTimeout.
type Abandoned struct {
	// Handler is the handler whose attempt it was.
	Handler string
	// Ran is how long the attempt had run when it was abandoned.
	Ran time.Duration
	// Timeout and Grace are the handler timeout and the grace past it.
	Timeout, Grace time.Duration
	// Shutdown is set when the stack's close, not the timeout, ended the wait.
	Shutdown bool
	// Stack is where the attempt's goroutine was when it was abandoned, bounded.
	Stack string
}

// Error says what was abandoned, after how long, and that it may still be running.
func (e *Abandoned) Error() string {
	if e.Shutdown {
		return fmt.Sprintf("handler %q abandoned after %s: the stack closed while it was still running", e.Handler, e.Ran.Round(time.Millisecond))
	}
	return fmt.Sprintf("handler %q abandoned after %s (handler timeout %s + grace %s): it did not return and may still be running",
		e.Handler, e.Ran.Round(time.Millisecond), e.Timeout, e.Grace)
}

// ErrorType names the failure for records, metrics and spans.
func (e *Abandoned) ErrorType() string { return ErrorType }

// Is matches sluice.ErrHandlerTimeout.
func (e *Abandoned) Is(target error) bool { return target == sluice.ErrHandlerTimeout }

// ErrorStack is where the attempt was stuck (the failure record's x-error-stack).
func (e *Abandoned) ErrorStack() string { return e.Stack }

// Observer is told of abandoned attempts (telemetry's metrics and rate-limited log).
type Observer interface {
	// Abandoned is called once per abandoned attempt, running counting it.
	Abandoned(ctx context.Context, a *Abandoned, running int)
	// Returned is called when an abandoned attempt's handler returned, with its error and
	// how long it ran in all; running no longer counts it.
	Returned(ctx context.Context, handler string, ran time.Duration, err error, running int)
}

// Config configures a Step.
type Config struct {
	// Timeout is the handler timeout. Required.
	Timeout time.Duration
	// Grace is how long past Timeout an attempt may still return before it is
	// abandoned. Zero means DefaultGrace.
	Grace time.Duration
	// HandoffTimeout bounds sluice's own work after the handler returned (publishing its
	// outputs, journaling its key): an attempt whose handler has returned is abandoned
	// only that much past Timeout plus Grace. Zero means no extra time.
	HandoffTimeout time.Duration
	// Cut is closed when the stack stops waiting for its handlers (its CloseTimeout has
	// run out): every attempt still running is abandoned and its message given back. Nil
	// means never.
	Cut <-chan struct{}
	// Observer, if not nil, is told of abandoned attempts.
	Observer Observer
	// Now is the clock. Nil means time.Now.
	Now func() time.Time
}

// Step is the attempt step of a set of handlers; Trackers are per handler.
type Step struct {
	cfg      Config
	seq      atomic.Uint64
	trackers sync.Map // handler name → *Tracker
	// bound makes a handler's Tracker on first use when the router did not.
	bound   int
	workers pool
}

// New returns the step. max is the bound of a handler's Tracker made on first use (a
// handler the router did not register, behind Middlewares); zero means DefaultMaxAbandoned.
func New(cfg Config, max int) *Step {
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if max <= 0 {
		max = DefaultMaxAbandoned
	}
	return &Step{cfg: cfg, bound: max}
}

// Grace is the grace in force.
func (s *Step) Grace() time.Duration { return s.cfg.Grace }

// Tracker returns handler's tracker, made with bound max (zero: the step's) and
// onBound (nil: nobody told) the first time.
func (s *Step) Tracker(handler string, max int, onBound func(Bound)) *Tracker {
	if max <= 0 {
		max = s.bound
	}
	t, _ := s.trackers.LoadOrStore(handler, &Tracker{handler: handler, max: max, onBound: onBound, now: s.cfg.Now})
	return t.(*Tracker)
}

// Trackers returns every tracker, for readiness and descriptions.
func (s *Step) Trackers() []*Tracker {
	var out []*Tracker
	s.trackers.Range(func(_, v any) bool {
		out = append(out, v.(*Tracker))
		return true
	})
	return out
}

type result struct {
	out []*message.Message
	err error
}

// Middleware runs h, the steps inside this one and the handler, on a goroutine of its own
// and returns its result, or an *Abandoned failure once the attempt has run Timeout plus
// Grace (plus HandoffTimeout when the handler has returned), or a give-back
// (disposition.ReturnUnprocessedError wrapping *Abandoned) when Cut closes first.
func (s *Step) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		handler := message.HandlerNameFromCtx(ctx)
		st := &State{id: s.seq.Add(1), start: s.cfg.Now()}
		// The attempt gets its own message: once abandoned, the steps outside go on with
		// msg (its context, its hand-off) while the handler may still read and write its
		// copy. The payload is shared: a handler does not write it.
		hm := message.NewMessage(msg.UUID, msg.Payload)
		hm.Metadata = make(message.Metadata, len(msg.Metadata))
		for k, v := range msg.Metadata {
			hm.Metadata[k] = v
		}
		hm.SetContext(&stateCtx{Context: ctx, st: st})
		done := make(chan result, 1)
		s.dispatch(job{st: st, h: h, hm: hm, handler: handler, done: done})

		timer := timers.Get().(*time.Timer)
		timer.Reset(s.cfg.Timeout + s.cfg.Grace)
		defer func() {
			timer.Stop()
			timers.Put(timer)
		}()
		extended := false
		for {
			select {
			case r := <-done:
				return r.out, r.err
			case <-s.cfg.Cut:
				return s.abandon(ctx, st, handler, true, done)
			case <-timer.C:
				if st.handlerReturned.Load() && !extended && s.cfg.HandoffTimeout > 0 {
					// The handler returned: what still runs is sluice's own, bounded work.
					extended = true
					timer.Reset(s.cfg.HandoffTimeout)
					continue
				}
				return s.abandon(ctx, st, handler, false, done)
			}
		}
	}
}

// abandon stops waiting for st, unless it finished meanwhile.
func (s *Step) abandon(ctx context.Context, st *State, handler string, shutdown bool, done <-chan result) ([]*message.Message, error) {
	stack := goroutineStack(st.id)
	if !st.abandon() {
		r := <-done // it finished just now
		return r.out, r.err
	}
	a := &Abandoned{Handler: handler, Ran: s.cfg.Now().Sub(st.start), Timeout: s.cfg.Timeout, Grace: s.cfg.Grace, Shutdown: shutdown, Stack: stack}
	tr := s.Tracker(handler, 0, nil)
	running := tr.add(1)
	if s.cfg.Observer != nil {
		s.cfg.Observer.Abandoned(ctx, a, running)
	}
	if shutdown {
		// Not the message's fault, and not a verdict on it: it goes back unacked.
		return nil, markers.ReturnUnprocessed(a)
	}
	return nil, a
}

// run runs attempt j on the calling goroutine (a worker's), labelled so that its stack can
// be found.
func (s *Step) run(j job) {
	st, h, hm, handler, done := j.st, j.h, j.hm, j.handler, j.done
	pprof.SetGoroutineLabels(st.labels())
	var r result
	func() {
		// The recoverer outside runs on another goroutine: a panic here would end the
		// process. It becomes an error carrying its stack, as a handler's does.
		defer func() {
			if p := recover(); p != nil {
				r = result{err: panics.Of(p)}
			}
		}()
		r.out, r.err = h(hm)
	}()
	done <- r
	if st.finish() {
		running := s.Tracker(handler, 0, nil).add(-1)
		if s.cfg.Observer != nil {
			s.cfg.Observer.Returned(hm.Context(), handler, s.cfg.Now().Sub(st.start), r.err, running)
		}
	}
}

// labelKey is the pprof label that finds an attempt's goroutine (and those it started);
// batchKey lists, as ",id,id,", the attempts whose batch a goroutine runs.
const (
	labelKey = "sluice_attempt"
	batchKey = "sluice_batch"
)

// LabelBatch labels the calling goroutine, which runs the batch of the messages whose
// contexts are ctxs, so that each of their attempts abandoned meanwhile finds it. self is
// the context of the attempt whose goroutine this is, nil for another goroutine (a timer's);
// restore puts the goroutine's own labels back.
func LabelBatch(self context.Context, ctxs ...context.Context) (restore func()) {
	var ids strings.Builder
	ids.WriteString(",")
	for _, ctx := range ctxs {
		if st := From(ctx); st != nil {
			ids.WriteString(strconv.FormatUint(st.id, 10) + ",")
		}
	}
	if ids.Len() == 1 {
		return func() {}
	}
	own := context.Background()
	if self != nil {
		if st := From(self); st != nil {
			own = st.labels()
		}
	}
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels(batchKey, ids.String())))
	return func() { pprof.SetGoroutineLabels(own) }
}

// labels is the label context of the attempt's goroutine.
func (st *State) labels() context.Context {
	return pprof.WithLabels(context.Background(), pprof.Labels(labelKey, strconv.FormatUint(st.id, 10)))
}

// goroutineStack returns the stacks of the goroutines labelled with attempt id (its own
// and a batch's it waits for), bounded.
func goroutineStack(id uint64) string {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		return ""
	}
	n := strconv.FormatUint(id, 10)
	own, inBatch := `"`+labelKey+`":"`+n+`"`, ","+n+","
	var out strings.Builder
	for _, block := range strings.Split(buf.String(), "\n\n") {
		lines := strings.Split(block, "\n")
		if len(lines) < 3 || !strings.HasPrefix(lines[1], "# labels: ") {
			continue
		}
		labels := lines[1]
		batch := strings.Contains(labels, `"`+batchKey+`":"`) && strings.Contains(labels, inBatch)
		if !batch && !strings.Contains(labels, own) {
			continue
		}
		if out.Len() > 0 {
			out.WriteString("\n")
		}
		for _, l := range lines[2:] {
			// "#\t0x4dcac7\tmain.stuck+0xa7\t\t/tmp/main.go:11" → "main.stuck+0xa7 /tmp/main.go:11"
			f := strings.Fields(strings.TrimPrefix(l, "#"))
			if len(f) >= 3 {
				out.WriteString(f[1] + "\n\t" + f[2] + "\n")
			}
		}
	}
	s := out.String()
	if len(s) > maxStackBytes {
		s = s[:maxStackBytes]
	}
	return s
}

// State is one attempt's, in its message's context (From): the idempotency step ties its
// key to it, the innermost step says when the handler returned.
type State struct {
	id              uint64
	start           time.Time
	handlerReturned atomic.Bool

	mu        sync.Mutex
	abandoned bool
	finished  bool
	tracked   []*track
}

type track struct {
	onAbandon func()
	ran       bool
	ended     bool
}

type stateCtx struct {
	context.Context
	st *State
}

type stateKey struct{}

func (c *stateCtx) Value(key any) any {
	if key == (stateKey{}) {
		return c.st
	}
	return c.Context.Value(key)
}

// From returns the attempt state in ctx, or nil outside the step.
func From(ctx context.Context) *State {
	st, _ := ctx.Value(stateKey{}).(*State)
	return st
}

// HandlerReturned says the handler itself returned: the rest of the attempt is sluice's
// own work (Config.HandoffTimeout).
func (st *State) HandlerReturned() { st.handlerReturned.Store(true) }

// Abandoned reports whether the step stopped waiting for the attempt.
func (st *State) Abandoned() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.abandoned
}

// Track runs onAbandon if the attempt is abandoned before end is called (at once if it
// was abandoned already). end reports whether onAbandon ran; the two never race.
func (st *State) Track(onAbandon func()) (end func() bool) {
	t := &track{onAbandon: onAbandon}
	st.mu.Lock()
	if st.abandoned {
		t.ran = true
		st.mu.Unlock()
		onAbandon()
	} else {
		st.tracked = append(st.tracked, t)
		st.mu.Unlock()
	}
	return func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		t.ended = true
		return t.ran
	}
}

// abandon marks the attempt abandoned, running what was tracked; it reports false when
// the attempt had finished already.
func (st *State) abandon() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.finished {
		return false
	}
	st.abandoned = true
	for _, t := range st.tracked {
		if !t.ended {
			t.ran = true
			// Under the lock, so that end sees it; the functions are short.
			t.onAbandon()
		}
	}
	st.tracked = nil
	return true
}

// finish marks the attempt finished; it reports whether it had been abandoned.
func (st *State) finish() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.finished = true
	return st.abandoned
}

// Bound is what a Tracker reports when its handler's abandoned attempts reach or leave
// their bound.
type Bound struct {
	Handler string
	// Stuck is true while Running is at least Max.
	Stuck bool
	// Running is how many abandoned attempts still run; Max the bound.
	Running, Max int
	// Since is when the handler became stuck.
	Since time.Time
}

// Tracker counts one handler's abandoned attempts still running.
type Tracker struct {
	handler string
	max     int
	onBound func(Bound)
	now     func() time.Time

	mu      sync.Mutex
	running int
	since   time.Time // when running reached max; zero below it
	total   int64
}

// add adds d to the running count and returns it, telling onBound when the bound is
// reached or left.
func (t *Tracker) add(d int) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.running += d
	if d > 0 {
		t.total += int64(d)
	}
	switch {
	case t.running >= t.max && t.since.IsZero():
		t.since = t.now()
		if t.onBound != nil {
			t.onBound(Bound{Handler: t.handler, Stuck: true, Running: t.running, Max: t.max, Since: t.since})
		}
	case t.running < t.max && !t.since.IsZero():
		since := t.since
		t.since = time.Time{}
		if t.onBound != nil {
			t.onBound(Bound{Handler: t.handler, Stuck: false, Running: t.running, Max: t.max, Since: since})
		}
	}
	return t.running
}

// Snapshot returns the tracker's state.
func (t *Tracker) Snapshot() Bound {
	t.mu.Lock()
	defer t.mu.Unlock()
	return Bound{Handler: t.handler, Stuck: !t.since.IsZero(), Running: t.running, Max: t.max, Since: t.since}
}

// Max is the tracker's bound.
func (t *Tracker) Max() int { return t.max }
