package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Defaults of OverloadConfig's zero fields.
const (
	// defaultBudgetRatio lets retries add a fifth of the first attempts, the ratio of gRPC's
	// retry throttling and Finagle's retry budget.
	defaultBudgetRatio = 0.2
	// defaultBudgetWindow is the sliding window of the budget and of the failure ratio.
	defaultBudgetWindow = 10 * time.Second
	// defaultMinRetriesPerSecond lets a dependency with little traffic still retry.
	defaultMinRetriesPerSecond = 1.0
	// defaultConcurrencyDelay is how long a retry refused by MaxConcurrentRetries waits.
	defaultConcurrencyDelay = time.Second
	// backlogRefresh is how old a backlog reading may be before it is read again.
	backlogRefresh = time.Second
)

// Errors of the overload protection.
var (
	// ErrRetryBudgetExhausted is matched (errors.Is) by the error of a message dead-lettered
	// because its dependency's retry budget was spent (OverloadConfig.ExhaustedToDLQ).
	ErrRetryBudgetExhausted = errors.New("retry budget exhausted")
	// ErrRetryConcurrency is the reason of a retry deferred because MaxConcurrentRetries
	// retries were already running against its dependency.
	ErrRetryConcurrency = errors.New("too many concurrent retries")
)

// Reasons of a RefusedEvent, also the values of the metric's reason attribute.
const (
	// RefusedBudget: the budget was spent; the retry waits MaxDelay or is dead-lettered.
	RefusedBudget = "budget"
	// RefusedConcurrency: MaxConcurrentRetries retries were running; the retry is deferred.
	RefusedConcurrency = "concurrency"
)

// OverloadConfig configures an Overload. Its zero value gives a retry budget of
// 0.2 over 10s, no concurrency limit and no adaptive policy.
type OverloadConfig struct {
	// BudgetRatio is the fraction of a dependency's first attempts that retries scheduled
	// soon may add over Window: 0.2 allows 20 retries for 100 first attempts. Zero means
	// 0.2; negative means no budget.
	BudgetRatio float64
	// Window is the sliding window over which first attempts, retries and failures are
	// counted. Zero means 10s.
	Window time.Duration
	// MinRetriesPerSecond is a floor of the budget (times Window) so a dependency with
	// little traffic can still retry. Zero means 1; negative none.
	MinRetriesPerSecond float64
	// ExhaustedToDLQ sends a message whose retry the budget refuses to the dead-letter
	// queue (error type retry_budget_exhausted). False means it is retried after the
	// policy's cap (Config.MaxDelay) instead of its backoff: later, never dropped.
	ExhaustedToDLQ bool
	// MaxConcurrentRetries caps the retries (attempts with x-retry-count above 0) running
	// at once against one dependency; a retry past it is deferred by ConcurrencyDelay
	// without using an attempt. Zero means no limit.
	MaxConcurrentRetries int
	// ConcurrencyDelay is the deferral of a retry refused by MaxConcurrentRetries. Zero
	// means 1s.
	ConcurrencyDelay time.Duration
	// Policy adapts a message's retries to its dependency's load (see AdaptivePolicy and
	// DefaultAdaptive). Nil means none: the step's own MaxRetries and backoff.
	Policy AdaptivePolicy
	// Backlog returns the number of messages waiting in queue, for Policy; it is called at
	// most once a second per queue. Nil (or an error) means the backlog is unknown (-1).
	// The router sets it to the broker's queue depth.
	Backlog func(ctx context.Context, queue string) (int, error)
	// OnRefused is called when a retry is refused (for metrics); it must be quick.
	OnRefused func(RefusedEvent)
	// Logger receives refusals (debug) and budget state changes (warn when a budget is
	// spent, info when it has room again). Nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock. Nil means time.Now.
	Now func() time.Time
}

// RefusedEvent describes a retry the overload protection refused.
type RefusedEvent struct {
	Dependency string
	Queue      string
	MessageID  string
	// Reason is RefusedBudget or RefusedConcurrency.
	Reason string
	// DeadLettered is set when the refused message went to the dead-letter queue.
	DeadLettered bool
}

// validate reports the first invalid field of c, for NewOverload. Zero values are valid.
func (c *OverloadConfig) validate() error {
	switch {
	case math.IsNaN(c.BudgetRatio) || math.IsInf(c.BudgetRatio, 0):
		return fmt.Errorf("retry: BudgetRatio %v is not a number", c.BudgetRatio)
	case c.Window < 0:
		return fmt.Errorf("retry: Window %s is negative", c.Window)
	case c.Window > 0 && c.Window < windowBuckets*time.Millisecond:
		return fmt.Errorf("retry: Window %s is shorter than %s", c.Window, windowBuckets*time.Millisecond)
	case math.IsNaN(c.MinRetriesPerSecond) || math.IsInf(c.MinRetriesPerSecond, 0):
		return fmt.Errorf("retry: MinRetriesPerSecond %v is not a number", c.MinRetriesPerSecond)
	case c.MaxConcurrentRetries < 0:
		return fmt.Errorf("retry: MaxConcurrentRetries %d is negative", c.MaxConcurrentRetries)
	case c.ConcurrencyDelay < 0:
		return fmt.Errorf("retry: ConcurrencyDelay %s is negative", c.ConcurrencyDelay)
	}
	return nil
}

func (c *OverloadConfig) setDefaults() {
	if c.BudgetRatio == 0 {
		c.BudgetRatio = defaultBudgetRatio
	}
	if c.Window == 0 {
		c.Window = defaultBudgetWindow
	}
	if c.MinRetriesPerSecond == 0 {
		c.MinRetriesPerSecond = defaultMinRetriesPerSecond
	} else if c.MinRetriesPerSecond < 0 {
		c.MinRetriesPerSecond = 0
	}
	if c.ConcurrencyDelay == 0 {
		c.ConcurrencyDelay = defaultConcurrencyDelay
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Overload is the retry step's overload protection, kept per dependency: a retry budget,
// a limit on concurrent retries and an adaptive policy. Put it in Config.Overload; the
// dependency of a message is its handler's breaker under router (WithBreaker's name),
// else its handler's name, else its queue. It is safe for concurrent use.
type Overload struct {
	cfg OverloadConfig

	mu   sync.Mutex
	deps map[string]*dependency
	// backlogs caches Backlog readings by queue.
	backlogs map[string]backlogReading
	// listeners are NotifyRefused's functions, each behind a pointer of its own so that
	// its stop function removes that one. A removal copies the slice: a refusal ranges
	// over the slice it read without the lock.
	listeners []*func(RefusedEvent)
	// brokerBacklog is UseBacklog's function, used when OverloadConfig.Backlog is nil
	// (kept apart so that Config() stays what the caller gave).
	brokerBacklog func(ctx context.Context, queue string) (int, error)
}

type backlogReading struct {
	n  int
	at time.Time
}

// dependency is the state of one dependency.
type dependency struct {
	name     string
	win      *window
	inFlight atomic.Int64
	retrying atomic.Int64 // retries in flight, for MaxConcurrentRetries
	spent    stateLog     // the budget refuses retries, for logging the changes
	adapted  stateLog     // the policy changes plans, likewise
}

// NewOverload validates cfg and applies its defaults.
func NewOverload(cfg OverloadConfig) (*Overload, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	return &Overload{cfg: cfg, deps: map[string]*dependency{}, backlogs: map[string]backlogReading{}}, nil
}

// Config returns the settings in force, defaults filled in.
func (o *Overload) Config() OverloadConfig { return o.cfg }

func (o *Overload) dependency(name string) *dependency {
	o.mu.Lock()
	defer o.mu.Unlock()
	d, ok := o.deps[name]
	if !ok {
		d = &dependency{name: name, win: newWindow(o.cfg.Window, o.cfg.Now())}
		o.deps[name] = d
	}
	return d
}

// allowance is how many retries the budget allows in a window holding first attempts.
func (o *Overload) allowance(first int64) float64 {
	return o.cfg.BudgetRatio*float64(first) + o.cfg.MinRetriesPerSecond*o.cfg.Window.Seconds()
}

// withdraw takes one retry from d's budget, reporting whether there was one.
func (o *Overload) withdraw(d *dependency) bool {
	if o.cfg.BudgetRatio < 0 {
		return true
	}
	now := o.cfg.Now()
	d.win.mu.Lock()
	sum := d.win.sumLocked(now)
	ok := float64(sum.retries)+1 <= o.allowance(sum.first)
	if ok {
		d.win.bucket[d.win.head].retries++
	}
	d.win.mu.Unlock()
	if d.spent.set(!ok, now, o.cfg.Window/windowBuckets) {
		if ok {
			o.cfg.Logger.Info("retry budget has room again", "dependency", d.name)
		} else {
			o.cfg.Logger.Warn("retry budget spent; retries wait the policy's cap", "dependency", d.name,
				"first_attempts", sum.first, "retries", sum.retries, "ratio", o.cfg.BudgetRatio, "window", o.cfg.Window,
				"dead_letter", o.cfg.ExhaustedToDLQ)
		}
	}
	return ok
}

// BudgetLeft returns, by dependency, how many more retries its budget allows now (for
// the sluice.retry.budget.remaining metric); without a budget it is empty.
func (o *Overload) BudgetLeft() map[string]float64 {
	if o.cfg.BudgetRatio < 0 {
		return map[string]float64{}
	}
	o.mu.Lock()
	deps := make([]*dependency, 0, len(o.deps))
	for _, d := range o.deps {
		deps = append(deps, d)
	}
	o.mu.Unlock()
	now := o.cfg.Now()
	out := make(map[string]float64, len(deps))
	for _, d := range deps {
		sum := d.win.sum(now)
		out[d.name] = max(o.allowance(sum.first)-float64(sum.retries), 0)
	}
	return out
}

// backlog returns queue's depth, read at most once per backlogRefresh; -1 when unknown.
func (o *Overload) backlog(ctx context.Context, queue string) int {
	now := o.cfg.Now()
	o.mu.Lock()
	backlog := o.cfg.Backlog
	if backlog == nil {
		backlog = o.brokerBacklog
	}
	r, ok := o.backlogs[queue]
	o.mu.Unlock()
	if backlog == nil || queue == "" {
		return -1
	}
	if ok && now.Sub(r.at) < backlogRefresh {
		return r.n
	}
	n, err := backlog(ctx, queue)
	if err != nil {
		o.cfg.Logger.Debug("queue depth unknown", "queue", queue, "error", err)
		n = -1
	}
	o.mu.Lock()
	o.backlogs[queue] = backlogReading{n: n, at: now}
	o.mu.Unlock()
	return n
}

// dependencyOf names the dependency of an attempt: the one the step was built for
// (ForDependency; router names the handler's breaker), else the handler, else the queue.
func dependencyOf(ctx context.Context, name string) string {
	if name != "" {
		return name
	}
	if name := message.HandlerNameFromCtx(ctx); name != "" {
		return name
	}
	return message.SubscribeTopicFromCtx(ctx)
}

// budgetExhaustedError is the error of a message dead-lettered because its retry budget
// was spent; users match it with errors.Is(err, ErrRetryBudgetExhausted). Its error type in the failure record is retry_budget_exhausted.
type budgetExhaustedError struct {
	Dependency string
	Err        error
}

// Error names the dependency and the last handler error.
func (e *budgetExhaustedError) Error() string {
	return fmt.Sprintf("retry budget of dependency %q exhausted: %v", e.Dependency, e.Err)
}

// Unwrap returns the last handler error.
func (e *budgetExhaustedError) Unwrap() error { return e.Err }

// Is matches ErrRetryBudgetExhausted.
func (e *budgetExhaustedError) Is(target error) bool { return target == ErrRetryBudgetExhausted }

// ErrorType names the failure in the dead-letter record.
func (e *budgetExhaustedError) ErrorType() string { return "retry_budget_exhausted" }

// DeadLetterReason names the reason in the dead-letter record (x-dead-letter-reason): the
// budget, not the handler's error, ended the message's retries.
func (e *budgetExhaustedError) DeadLetterReason() string { return "retry_budget_exhausted" }

// UseBacklog gives the overload protection the broker's queue depth, used while
// OverloadConfig.Backlog is nil (Config() stays what the caller gave); the router calls it
// before the stack runs.
func (o *Overload) UseBacklog(f func(ctx context.Context, queue string) (int, error)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.brokerBacklog = f
}

// NotifyRefused adds f to the functions called when a retry is refused, after
// OverloadConfig.OnRefused (the router counts refusals in a metric with it), until the
// returned stop function is called: a Stack stops its listener when it closes, so an
// Overload shared by many stacks does not keep every closed one's.
func (o *Overload) NotifyRefused(f func(RefusedEvent)) (stop func()) {
	l := &f
	o.mu.Lock()
	defer o.mu.Unlock()
	o.listeners = append(o.listeners[:len(o.listeners):len(o.listeners)], l)
	return func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		for i, have := range o.listeners {
			if have == l {
				o.listeners = append(o.listeners[:i:i], o.listeners[i+1:]...)
				return
			}
		}
	}
}

// stateLog tracks an on/off state for logging its changes. It turns off only once it has
// not been set on for hold, so a state flapping at its boundary (a budget with just enough
// room for every other retry) logs once, not at every call.
type stateLog struct {
	on     atomic.Bool
	lastOn atomic.Int64 // unix nanoseconds
}

// set records the state at now and reports whether that is a change to log.
func (s *stateLog) set(on bool, now time.Time, hold time.Duration) bool {
	if on {
		s.lastOn.Store(now.UnixNano())
		return !s.on.Swap(true)
	}
	if !s.on.Load() || now.UnixNano()-s.lastOn.Load() < int64(hold) {
		return false
	}
	return s.on.Swap(false)
}
