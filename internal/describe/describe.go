// Package describe builds a stack's policy.Description from the settings the stack
// holds (router.Stack.Describe gathers them into Inputs): each handler's queues, retry
// schedule, budget, breaker, idempotency step and learned view, and the decision table's
// rows (package internal/decide) with the handler's settings.
package describe

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/breakerhook"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/policy"
)

// noteNoQueues is the note of a description with a handler whose queue is not recorded.
const noteNoQueues = "a handler's queue is not known to the stack"

// Journal is a journaled idempotency step of one consumed queue.
type Journal struct {
	Queue string
	// WithKey is set when the handler gave a key function (router.WithIdempotencyKey).
	WithKey bool
}

// Inputs are what a stack holds of its handlers and steps.
type Inputs struct {
	// Names are the registered Watermill handlers, partitions' "<name>#<k>" included;
	// Topics the queue each consumes.
	Names  []string
	Topics map[string]string
	// Native is each handler's native delayed retry (router.WithNativeRetry).
	Native map[string]broker.NativeRetry
	// Pausing says which handlers pause while their breaker is open.
	Pausing map[string]bool
	// Retry is the retry step's settings in force; BudgetLeft its overload protection's
	// budget per dependency (nil without one); Judge the learned policy's verdict (nil
	// without one) over Stats.
	Retry      retry.Config
	BudgetLeft func() map[string]float64
	Judge      retrystats.Judge
	Stats      *retrystats.Stats
	// Breakers is the stack's breaker registry; nil without one.
	Breakers *breaker.Registry
	// Idempotency names the idempotency step's Go type, "" without one; Journals are its
	// journaled queues.
	Idempotency string
	Journals    []Journal
	// HandlerTimeout, AbandonGrace and MaxAbandoned are the attempt step's; Settle is
	// each handler's settle bound.
	HandlerTimeout, AbandonGrace time.Duration
	MaxAbandoned                 int
	Settle                       map[string]time.Duration
	// Compensations names where each compensated handler's event goes
	// (router.WithCompensation).
	Compensations map[string]string
}

// Build returns the description of in: a handler per registration (a partitioned
// handler's partitions described with it), in name order.
func Build(in Inputs) policy.Description {
	names := slices.Sorted(slices.Values(in.Names))
	isName := map[string]bool{}
	for _, n := range names {
		isName[n] = true
	}
	base := retryPolicy(in.Retry)
	var byHandler map[string][]retrystats.TypeStats
	if in.Judge != nil && in.Stats != nil {
		byHandler = map[string][]retrystats.TypeStats{}
		for _, t := range in.Stats.Snapshot() {
			byHandler[t.Handler] = append(byHandler[t.Handler], t)
		}
	}
	breakers := breakerStates(in.Breakers)
	var d policy.Description
	missingQueue := false
	for _, name := range names {
		if b, _, part := partitionOf(name); part && isName[b] {
			continue // a partition's handler, described with its registration
		}
		h := policy.HandlerDescription{Name: name, HandlerTimeout: policy.Duration(in.HandlerTimeout), AbandonGrace: policy.Duration(in.AbandonGrace),
			MaxAbandoned: in.MaxAbandoned, SettleWithin: policy.Duration(in.Settle[name]), Retry: base}
		if q, ok := in.Topics[name]; ok {
			h.Queue, h.Consumes = q, []string{q}
		} else {
			for k := 0; ; k++ {
				q, ok := in.Topics[name+"#"+strconv.Itoa(k)]
				if !ok {
					break
				}
				h.Consumes = append(h.Consumes, q)
				h.Partitions++
				h.Queue = strings.TrimSuffix(q, topology.PartitionInfix+strconv.Itoa(k))
			}
		}
		if h.Queue == "" {
			missingQueue = true
		} else {
			h.DeadLetterQueue, h.Archive = topology.DLQ(h.Queue), topology.Archive(h.Queue)
		}
		if nr, ok := in.Native[name]; ok {
			h.Retry = nativePolicy(base, nr)
		}
		h.Breaker = breakerOf(in.Breakers, name, in.Pausing[name], breakers, isName)
		h.Retry.Budget = budgetOf(in.BudgetLeft, name, h.Breaker, base.Budget)
		h.Idempotency = idempotencyOf(in, h)
		h.Compensation = in.Compensations[name]
		h.ErrorClasses = classActions(h)
		if in.Judge != nil {
			h.Learned = []policy.LearnedView{}
			for _, t := range byHandler[name] {
				h.Learned = append(h.Learned, policy.LearnedView{ErrorType: t.ErrorType, Verdict: in.Judge(t)})
			}
		}
		d.Handlers = append(d.Handlers, h)
	}
	if missingQueue {
		d.Notes = append(d.Notes, noteNoQueues)
	}
	d.Breakers = breakers
	if in.Breakers != nil {
		d.Notes = append(d.Notes, "breaker trip thresholds (ConsecutiveFailures, FailureRatio, MinRequests, Interval) are not shown: breaker.Registry does not expose its Config")
	}
	return d
}

// nativePolicy is p for a handler whose queue carries its retries itself: the queue's
// schedule replaces the backoff's.
func nativePolicy(p policy.RetryPolicy, nr broker.NativeRetry) policy.RetryPolicy {
	p.Native = &policy.NativeRetryPolicy{Min: policy.Duration(nr.Min), Max: policy.Duration(nr.Max)}
	p.Schedule = make([]policy.ScheduledRetry, 0, p.MaxRetries)
	var elapsed time.Duration
	for n := 1; n <= p.MaxRetries; n++ {
		d := nr.Delay(n)
		elapsed += d
		p.Schedule = append(p.Schedule, policy.ScheduledRetry{Retry: n, Attempt: n + 1, Delay: policy.Duration(d), MinDelay: policy.Duration(d),
			MaxDelay: policy.Duration(d), Elapsed: policy.Duration(elapsed)})
	}
	return p
}

// partitionOf splits a partition handler's name "<name>#<k>".
func partitionOf(name string) (base string, k int, ok bool) {
	i := strings.LastIndexByte(name, '#')
	if i < 0 {
		return "", 0, false
	}
	k, err := strconv.Atoi(name[i+1:])
	if err != nil || k < 0 {
		return "", 0, false
	}
	return name[:i], k, true
}

// retryPolicy is the retry step's policy c, its schedule computed as the step computes it.
func retryPolicy(c retry.Config) policy.RetryPolicy {
	p := policy.RetryPolicy{
		MaxRetries: c.MaxRetries, MaxAttempts: c.MaxRetries + 1, InitialDelay: policy.Duration(c.InitialDelay), Multiplier: c.Multiplier,
		MaxDelay: policy.Duration(c.MaxDelay), Jitter: c.Jitter, MaxTotalAge: policy.Duration(c.MaxTotalAge), MaxRetryAfter: policy.Duration(c.MaxRetryAfter),
		Schedule: []policy.ScheduledRetry{},
	}
	// The step's own backoff (retry.Retry.Backoff) without its randomization.
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(c.InitialDelay),
		backoff.WithMultiplier(c.Multiplier),
		backoff.WithMaxInterval(c.MaxDelay),
		backoff.WithRandomizationFactor(0),
		backoff.WithMaxElapsedTime(0),
	)
	var elapsed time.Duration
	for n := 1; n <= c.MaxRetries; n++ {
		d := b.NextBackOff()
		elapsed += d
		p.Schedule = append(p.Schedule, policy.ScheduledRetry{
			Retry: n, Attempt: n + 1, Delay: policy.Duration(d), Elapsed: policy.Duration(elapsed),
			MinDelay: policy.Duration(float64(d) * (1 - c.Jitter)), MaxDelay: policy.Duration(float64(d) * (1 + c.Jitter)),
		})
	}
	if o := c.Overload; o != nil {
		oc := o.Config()
		bud := &policy.RetryBudget{
			Ratio: max(oc.BudgetRatio, 0), Window: policy.Duration(oc.Window), MinRetriesPerSecond: oc.MinRetriesPerSecond,
			MaxConcurrentRetries: oc.MaxConcurrentRetries, ConcurrencyDelay: policy.Duration(oc.ConcurrencyDelay), Adaptive: oc.Policy != nil,
			WhenSpent: fmt.Sprintf("retried after MaxDelay (%s) instead of its backoff", c.MaxDelay),
		}
		if oc.BudgetRatio < 0 {
			bud.WhenSpent = "no budget"
		} else if oc.ExhaustedToDLQ {
			bud.WhenSpent = "dead-lettered (error type retry_budget_exhausted)"
		}
		p.Budget = bud
	}
	if l := c.Learned; l != nil {
		p.Learned = &retrystats.LearnedSettings{MinEvidence: l.MinEvidence, UnlikelyBelow: l.UnlikelyBelow, Explore: l.Explore, Shorten: l.Shorten}
	}
	return p
}

// budgetOf returns the handler's copy of the budget, its dependency and what is left
// filled in when the budget is kept under the handler's name or its breaker's.
func budgetOf(budgetLeft func() map[string]float64, handler string, br *policy.BreakerDescription, b *policy.RetryBudget) *policy.RetryBudget {
	if b == nil || budgetLeft == nil {
		return b
	}
	c := *b
	left := budgetLeft()
	deps := []string{handler}
	if br != nil && br.Dependency != "" {
		deps = []string{br.Dependency, handler}
	}
	for _, dep := range deps {
		if l, ok := left[dep]; ok {
			c.Dependency, c.Left = dep, &l
			break
		}
	}
	return &c
}

// breakerStates lists the registry's breakers created so far.
func breakerStates(reg *breaker.Registry) []policy.BreakerState {
	if reg == nil {
		return nil
	}
	states := reg.States()
	out := make([]policy.BreakerState, 0, len(states))
	for name, st := range states {
		b := breakerhook.Of(reg.Breaker(name)) // exists: States lists created ones only
		out = append(out, policy.BreakerState{Dependency: name, State: st.String(), OpenTimeout: policy.Duration(b.OpenTimeout()), HalfOpenProbes: b.Probes()})
	}
	slices.SortFunc(out, func(a, b policy.BreakerState) int { return strings.Compare(a.Dependency, b.Dependency) })
	return out
}

// breakerOf describes handler's breaker: it pauses when the stack holds a pause
// controller for it, else defers. Its dependency is inferred from the breakers the
// registry holds (each handler's is created at registration): the one bearing the
// handler's name, else the only one named after none of the stack's handlers (a
// WithBreaker name); unknown when there are several such.
func breakerOf(reg *breaker.Registry, handler string, pauses bool, states []policy.BreakerState, isName map[string]bool) *policy.BreakerDescription {
	if reg == nil {
		return nil
	}
	b := &policy.BreakerDescription{WhileOpen: "defer"}
	if pauses {
		b.WhileOpen = "pause"
	}
	var own, other []policy.BreakerState
	for _, st := range states {
		switch {
		case st.Dependency == handler:
			own = append(own, st)
		case !isName[st.Dependency]:
			other = append(other, st)
		}
	}
	if len(own) == 0 && len(other) == 1 {
		own = other
	}
	if len(own) == 1 {
		st := own[0]
		b.Dependency, b.State, b.OpenTimeout, b.HalfOpenProbes = st.Dependency, st.State, st.OpenTimeout, st.HalfOpenProbes
	}
	return b
}

// idempotencyOf describes h's idempotency step.
func idempotencyOf(in Inputs, h policy.HandlerDescription) *policy.IdempotencyDescription {
	if in.Idempotency == "" {
		return nil
	}
	d := &policy.IdempotencyDescription{
		Step: in.Idempotency,
		Key:  fmt.Sprintf("the %q metadata, else the handler's key function (WithIdempotencyKey) when it has one, else the message id", sluice.HeaderIdempotencyKey),
	}
	var journals []string
	withKey := false
	for _, j := range in.Journals {
		if slices.Contains(h.Consumes, j.Queue) {
			journals = append(journals, topology.IdempotencyJournal(j.Queue))
			withKey = withKey || j.WithKey
		}
	}
	if len(journals) > 0 {
		d.Journal = strings.Join(journals, ", ")
		if withKey {
			d.Key = fmt.Sprintf("the %q metadata, else the handler's key function (WithIdempotencyKey)", sluice.HeaderIdempotencyKey)
		} else {
			d.Key = fmt.Sprintf("the %q metadata, else the message id", sluice.HeaderIdempotencyKey)
		}
	}
	return d
}

// classActions says what each case of the decision table leads to for h: the table's own
// sentences (package internal/decide), with h's settings.
func classActions(h policy.HandlerDescription) []policy.ClassAction {
	p := h.Retry
	v := decide.View{
		DeadLetterQueue: h.DeadLetterQueue, MaxRetries: p.MaxRetries, MaxTotalAge: time.Duration(p.MaxTotalAge),
		MaxRetryAfter: time.Duration(p.MaxRetryAfter), Native: p.Native != nil, Idempotent: h.Idempotency != nil,
		HandlerTimeout: time.Duration(h.HandlerTimeout), AbandonGrace: time.Duration(h.AbandonGrace), MaxAbandoned: h.MaxAbandoned,
		Compensation: h.Compensation,
	}
	if l := p.Learned; l != nil {
		v.Learned = &decide.Learned{MinEvidence: l.MinEvidence, UnlikelyBelow: l.UnlikelyBelow, Explore: l.Explore}
	}
	if b := p.Budget; b != nil && b.WhenSpent != "no budget" {
		v.Budget = fmt.Sprintf("a retry past the dependency's budget (%g of first attempts over %s, at least %g/s) is %s",
			b.Ratio, b.Window, b.MinRetriesPerSecond, b.WhenSpent)
	}
	if b := h.Breaker; b != nil {
		v.Breaker = b.WhileOpen
	}
	var out []policy.ClassAction
	for _, r := range decide.Explain(v) {
		out = append(out, policy.ClassAction{Class: r.Case, Action: r.Fate})
	}
	return out
}
