package router

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/retrystats"
)

// Duration is a time.Duration written to and read from JSON as a Go duration ("1.5s").
type Duration time.Duration

// String is the Go duration without its zero minutes and seconds ("24h", "1m30s").
func (d Duration) String() string {
	s := time.Duration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// MarshalJSON writes the Go duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a Go duration string (or a number of nanoseconds).
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if nerr := json.Unmarshal(b, &n); nerr != nil {
			return fmt.Errorf("duration: %w", err)
		}
		*d = Duration(n)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Description is what a stack does with each handler's failures: the retry decision
// matrix an operator reads in a runbook (Markdown) or a tool reads as JSON (the service's
// GET /debug/sluice/policy). Stack.Describe builds it from the settings in force.
type Description struct {
	// Handlers are the stack's handlers, by name.
	Handlers []HandlerDescription `json:"handlers"`
	// Breakers are the stack's circuit breakers created so far (Config.Breakers), by
	// dependency name.
	Breakers []BreakerState `json:"breakers,omitempty"`
	// Notes say what the description could not tell.
	Notes []string `json:"notes,omitempty"`
}

// HandlerDescription is one handler's row of the matrix.
type HandlerDescription struct {
	Name string `json:"name"`
	// Queue is the queue the handler was registered on; empty when the stack could not
	// tell (see Description.Notes).
	Queue string `json:"queue"`
	// Consumes are the queues its consumers read: Queue, or its partitions.
	Consumes []string `json:"consumes"`
	// Partitions is the WithPartitions count; zero for a plain queue.
	Partitions int `json:"partitions,omitempty"`
	// DeadLetterQueue and Archive are where its dead letters go and where operators
	// archive them.
	DeadLetterQueue string `json:"dead_letter_queue"`
	Archive         string `json:"archive"`
	// HandlerTimeout is the deadline of one attempt (a retryable failure when passed);
	// AbandonGrace how long past it the stack still waits before it abandons the attempt;
	// MaxAbandoned how many abandoned attempts may still run before the handler pauses.
	HandlerTimeout Duration `json:"handler_timeout"`
	AbandonGrace   Duration `json:"abandon_grace"`
	MaxAbandoned   int      `json:"max_abandoned"`
	// SettleWithin is how long after its delivery the stack acks or gives back any of the
	// handler's deliveries at the latest, a wait in the prefetch buffer included: the
	// consumer timeout the broker is asked not to go below (docs/reliability.md).
	SettleWithin Duration `json:"settle_within"`
	// ErrorClasses say what each class of error leads to.
	ErrorClasses []ClassAction `json:"error_classes"`
	// Retry is the retry policy.
	Retry RetryPolicy `json:"retry"`
	// Breaker is the handler's circuit breaker; nil without Config.Breakers.
	Breaker *BreakerDescription `json:"breaker,omitempty"`
	// Idempotency is the idempotency step; nil without Config.Idempotency.
	Idempotency *IdempotencyDescription `json:"idempotency,omitempty"`
	// Learned is the learned retry policy's current view of each error type the handler
	// failed with in the statistics' window; nil without Config.Retry.Learned.
	Learned []LearnedView `json:"learned,omitempty"`
}

// SettleText says SettleWithin for a reader: "every delivery settled within …", or that
// the service did not report it (a description from a sluice before the bound).
func (h HandlerDescription) SettleText() string {
	if h.SettleWithin <= 0 {
		return "not reported by the service"
	}
	return fmt.Sprintf("every delivery settled within %s of its delivery, prefetch wait included; RabbitMQ's consumer timeout must not be lower", h.SettleWithin)
}

// ClassAction is what an error class leads to.
type ClassAction struct {
	// Class is an error class (sluice.Class's names), or "retry_after",
	// "retry_unlikely" (the learned policy) and "breaker_open".
	Class  string `json:"class"`
	Action string `json:"action"`
}

// RetryPolicy is the retry step's policy as it applies to a handler.
type RetryPolicy struct {
	// MaxRetries is how many retries a message gets after its first attempt;
	// MaxAttempts is MaxRetries+1.
	MaxRetries  int `json:"max_retries"`
	MaxAttempts int `json:"max_attempts"`
	// The backoff: InitialDelay grown by Multiplier up to MaxDelay, randomized by ±Jitter.
	InitialDelay Duration `json:"initial_delay"`
	Multiplier   float64  `json:"multiplier"`
	MaxDelay     Duration `json:"max_delay"`
	Jitter       float64  `json:"jitter"`
	// MaxTotalAge bounds a message's retries and deferrals from its first failure.
	MaxTotalAge Duration `json:"max_total_age"`
	// MaxRetryAfter caps a RetryAfter wait and a single Defer.
	MaxRetryAfter Duration `json:"max_retry_after"`
	// Schedule is every retry's delay.
	Schedule []ScheduledRetry `json:"schedule"`
	// Budget is the overload protection (Config.Retry.Overload); nil without it.
	Budget *RetryBudget `json:"budget,omitempty"`
	// Learned is the learned policy's settings; nil without one.
	Learned *retrystats.LearnedSettings `json:"learned,omitempty"`
	// Native is the queue's own delayed retry (WithNativeRetry); nil without one. With
	// it, Schedule is the queue's linear schedule, without jitter.
	Native *NativeRetryPolicy `json:"native,omitempty"`
}

// NativeRetryPolicy is a handler's native delayed retry (WithNativeRetry): the queue holds
// a rejected delivery back Min × its delivery count, at most Max.
type NativeRetryPolicy struct {
	Min Duration `json:"min"`
	Max Duration `json:"max"`
}

// ScheduledRetry is one retry of the schedule.
type ScheduledRetry struct {
	// Retry counts from 1; the message comes back for attempt Retry+1.
	Retry   int `json:"retry"`
	Attempt int `json:"attempt"`
	// Delay is the backoff before it without jitter (retry.Retry.Backoff(Retry) with
	// NoJitter); MinDelay and MaxDelay bound it with jitter.
	Delay    Duration `json:"delay"`
	MinDelay Duration `json:"min_delay"`
	MaxDelay Duration `json:"max_delay"`
	// Elapsed is the sum of the delays up to this one: how long after its first failure
	// the attempt comes, handler time aside.
	Elapsed Duration `json:"elapsed"`
}

// RetryBudget is the overload protection of a handler's dependency.
type RetryBudget struct {
	// Dependency is the name the budget is kept under (WithBreaker's, else the handler's
	// name); empty when the stack could not tell.
	Dependency string `json:"dependency,omitempty"`
	// Ratio of first attempts that retries may add over Window, with a floor of
	// MinRetriesPerSecond.
	Ratio               float64  `json:"ratio"`
	Window              Duration `json:"window"`
	MinRetriesPerSecond float64  `json:"min_retries_per_second"`
	// WhenSpent says what a refused retry does.
	WhenSpent string `json:"when_spent"`
	// MaxConcurrentRetries caps the retries running at once (0: no cap); a retry past it is
	// deferred by ConcurrencyDelay.
	MaxConcurrentRetries int      `json:"max_concurrent_retries"`
	ConcurrencyDelay     Duration `json:"concurrency_delay"`
	// Adaptive is true when an adaptive policy trims retries under load.
	Adaptive bool `json:"adaptive"`
	// Left is the budget left now, when the dependency is known and has one.
	Left *float64 `json:"left,omitempty"`
}

// BreakerDescription is a handler's circuit breaker.
type BreakerDescription struct {
	// Dependency names the breaker (WithBreaker's name, else the handler's), inferred from
	// the registry's breakers: the one named after the handler, else the only one named
	// after none of the stack's handlers; empty when that leaves several.
	Dependency string `json:"dependency,omitempty"`
	// WhileOpen is "pause" (the handler stops taking deliveries) or "defer" (messages go
	// back through the delay until the breaker lets them through: WithDeferWhileOpen).
	WhileOpen string `json:"while_open"`
	// State, OpenTimeout and HalfOpenProbes are the breaker's, when it is known.
	State          string   `json:"state,omitempty"`
	OpenTimeout    Duration `json:"open_timeout,omitempty"`
	HalfOpenProbes int      `json:"half_open_probes,omitempty"`
}

// BreakerState is a circuit breaker of the stack's registry.
type BreakerState struct {
	Dependency     string   `json:"dependency"`
	State          string   `json:"state"`
	OpenTimeout    Duration `json:"open_timeout"`
	HalfOpenProbes int      `json:"half_open_probes"`
}

// IdempotencyDescription is a handler's idempotency step.
type IdempotencyDescription struct {
	// Step is the step's Go type.
	Step string `json:"step"`
	// Key says where a message's key comes from.
	Key string `json:"key"`
	// Journal is the stream the done keys are journaled on; empty when they are not.
	Journal string `json:"journal,omitempty"`
}

// LearnedView is the learned policy's view of one error type of a handler.
type LearnedView struct {
	ErrorType string `json:"error_type"`
	retrystats.Verdict
}

// noteNoQueues is the note of a description with a handler whose queue is not recorded.
const noteNoQueues = "a handler's queue is not known to the stack"

// Describe returns what the stack does with each handler's failures, from the settings in
// force. It can be called at any time, before Run, while running or after Close.
//
// What the stack does not record of a handler's options is left out or inferred: the
// breaker's trip thresholds are left out (breaker.Registry keeps its Config to itself,
// said in Notes); the dependency a WithBreaker option names is inferred from the
// registry's breakers (see BreakerDescription.Dependency); whether a handler gave
// WithIdempotencyKey is known for journaled steps only.
func (s *Stack) Describe() Description {
	s.mu.Lock()
	names := make([]string, 0, len(s.names))
	for n := range s.names {
		names = append(names, n)
	}
	parts := slices.Clone(s.parts)
	slots := slices.Clone(s.slots)
	topics := maps.Clone(s.topics)
	native := maps.Clone(s.native)
	settle := maps.Clone(s.settle)
	s.mu.Unlock()
	slices.Sort(names)

	var d Description
	pausing := map[string]bool{}
	for _, p := range parts {
		if p.paused != nil {
			pausing[p.handler] = true
		}
	}
	isName := map[string]bool{}
	for _, n := range names {
		isName[n] = true
	}
	policy := s.retryPolicy()
	stats := s.retry.Stats()
	judge := s.judge()
	var byHandler map[string][]retrystats.TypeStats
	if judge != nil && stats != nil {
		byHandler = map[string][]retrystats.TypeStats{}
		for _, t := range stats.Snapshot() {
			byHandler[t.Handler] = append(byHandler[t.Handler], t)
		}
	}
	breakers := s.breakerStates()
	missingQueue := false
	for _, name := range names {
		if base, _, part := partitionOf(name); part && isName[base] {
			continue // a partition's handler, described with its registration
		}
		h := HandlerDescription{Name: name, HandlerTimeout: Duration(s.cfg.HandlerTimeout), AbandonGrace: Duration(s.cfg.AbandonGrace),
			MaxAbandoned: s.cfg.MaxAbandoned, SettleWithin: Duration(settle[name]), Retry: policy}
		if q, ok := topics[name]; ok {
			h.Queue, h.Consumes = q, []string{q}
		} else {
			for k := 0; ; k++ {
				q, ok := topics[partitionHandlerName(name, k)]
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
		if nr, ok := native[name]; ok {
			h.Retry = nativePolicy(policy, nr)
		}
		h.Breaker = s.breakerOf(name, pausing[name], breakers, isName)
		h.Retry.Budget = s.budgetOf(name, h.Breaker, policy.Budget)
		h.Idempotency = s.idempotencyOf(h, slots)
		h.ErrorClasses = classActions(h)
		if judge != nil {
			h.Learned = []LearnedView{}
			for _, t := range byHandler[name] {
				h.Learned = append(h.Learned, LearnedView{ErrorType: t.ErrorType, Verdict: judge(t)})
			}
		}
		d.Handlers = append(d.Handlers, h)
	}
	if missingQueue {
		d.Notes = append(d.Notes, noteNoQueues)
	}
	d.Breakers = breakers
	if s.cfg.Breakers != nil {
		d.Notes = append(d.Notes, "breaker trip thresholds (ConsecutiveFailures, FailureRatio, MinRequests, Interval) are not shown: breaker.Registry does not expose its Config")
	}
	return d
}

// nativePolicy is p for a handler whose queue carries its retries itself: the queue's
// schedule replaces the backoff's.
func nativePolicy(p RetryPolicy, nr broker.NativeRetry) RetryPolicy {
	p.Native = &NativeRetryPolicy{Min: Duration(nr.Min), Max: Duration(nr.Max)}
	p.Schedule = make([]ScheduledRetry, 0, p.MaxRetries)
	var elapsed time.Duration
	for n := 1; n <= p.MaxRetries; n++ {
		d := nr.Delay(n)
		elapsed += d
		p.Schedule = append(p.Schedule, ScheduledRetry{Retry: n, Attempt: n + 1, Delay: Duration(d), MinDelay: Duration(d), MaxDelay: Duration(d), Elapsed: Duration(elapsed)})
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

// retryPolicy is the retry step's policy, its schedule computed as the step computes it.
func (s *Stack) retryPolicy() RetryPolicy {
	c := s.retry.Config()
	p := RetryPolicy{
		MaxRetries: c.MaxRetries, MaxAttempts: c.MaxRetries + 1, InitialDelay: Duration(c.InitialDelay), Multiplier: c.Multiplier,
		MaxDelay: Duration(c.MaxDelay), Jitter: c.Jitter, MaxTotalAge: Duration(c.MaxTotalAge), MaxRetryAfter: Duration(c.MaxRetryAfter),
		Schedule: []ScheduledRetry{},
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
		p.Schedule = append(p.Schedule, ScheduledRetry{
			Retry: n, Attempt: n + 1, Delay: Duration(d), Elapsed: Duration(elapsed),
			MinDelay: Duration(float64(d) * (1 - c.Jitter)), MaxDelay: Duration(float64(d) * (1 + c.Jitter)),
		})
	}
	if o := c.Overload; o != nil {
		oc := o.Config()
		bud := &RetryBudget{
			Ratio: max(oc.BudgetRatio, 0), Window: Duration(oc.Window), MinRetriesPerSecond: oc.MinRetriesPerSecond,
			MaxConcurrentRetries: oc.MaxConcurrentRetries, ConcurrencyDelay: Duration(oc.ConcurrencyDelay), Adaptive: oc.Policy != nil,
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
func (s *Stack) budgetOf(handler string, br *BreakerDescription, b *RetryBudget) *RetryBudget {
	if b == nil {
		return nil
	}
	c := *b
	left := s.retry.Config().Overload.BudgetLeft()
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
func (s *Stack) breakerStates() []BreakerState {
	if s.cfg.Breakers == nil {
		return nil
	}
	states := s.cfg.Breakers.States()
	out := make([]BreakerState, 0, len(states))
	for name, st := range states {
		b := s.cfg.Breakers.Breaker(name) // exists: States lists created ones only
		out = append(out, BreakerState{Dependency: name, State: st.String(), OpenTimeout: Duration(b.OpenTimeout()), HalfOpenProbes: b.Probes()})
	}
	slices.SortFunc(out, func(a, b BreakerState) int { return strings.Compare(a.Dependency, b.Dependency) })
	return out
}

// breakerOf describes handler's breaker: it pauses when the stack holds a pause
// controller for it, else defers. Its dependency is inferred from the breakers the
// registry holds (each handler's is created at registration): the one bearing the
// handler's name, else the only one named after none of the stack's handlers (a
// WithBreaker name); unknown when there are several such.
func (s *Stack) breakerOf(handler string, pauses bool, states []BreakerState, isName map[string]bool) *BreakerDescription {
	if s.cfg.Breakers == nil {
		return nil
	}
	b := &BreakerDescription{WhileOpen: "defer"}
	if pauses {
		b.WhileOpen = "pause"
	}
	var own, other []BreakerState
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
func (s *Stack) idempotencyOf(h HandlerDescription, slots []*journalSlot) *IdempotencyDescription {
	if s.cfg.Idempotency == nil {
		return nil
	}
	d := &IdempotencyDescription{
		Step: fmt.Sprintf("%T", s.cfg.Idempotency),
		Key:  fmt.Sprintf("the %q metadata, else the handler's key function (WithIdempotencyKey) when it has one, else the message id", sluice.HeaderIdempotencyKey),
	}
	var journals []string
	withKey := false
	for _, sl := range slots {
		if slices.Contains(h.Consumes, sl.name) {
			journals = append(journals, topology.IdempotencyJournal(sl.name))
			withKey = withKey || sl.key != nil
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

// classActions says what each class of error leads to for h.
func classActions(h HandlerDescription) []ClassAction {
	p := h.Retry
	dlq := "the dead-letter queue"
	if h.DeadLetterQueue != "" {
		dlq = h.DeadLetterQueue
	}
	retryable := fmt.Sprintf("retried after the schedule's delay, up to %d retries (%d attempts) within %s of the first failure; then dead-lettered to %s (retries exhausted)",
		p.MaxRetries, p.MaxAttempts, p.MaxTotalAge, dlq)
	if p.Native != nil {
		retryable = fmt.Sprintf("rejected back to its queue, which holds it back the schedule's delay (native delayed retry), up to %d retries (%d attempts); then dead-lettered to %s (retries exhausted)",
			p.MaxRetries, p.MaxAttempts, dlq)
	}
	if p.MaxRetries == 0 {
		retryable = fmt.Sprintf("dead-lettered to %s at once (no retries)", dlq)
	}
	out := []ClassAction{
		{Class: sluice.ClassRetryable.String(), Action: retryable},
		{Class: "retry_after", Action: fmt.Sprintf("retried after the error's own delay (at most %s), using an attempt; as retryable otherwise", p.MaxRetryAfter)},
		{Class: sluice.ClassPermanent.String(), Action: "dead-lettered to " + dlq + " at once"},
		{Class: sluice.ClassDiscard.String(), Action: "acked and logged (warn); not dead-lettered"},
		{Class: sluice.ClassDefer.String(), Action: fmt.Sprintf("redelivered after the given delay (at most %s) without using an attempt, until %s after the first deferral; then dead-lettered (deferral expired)", p.MaxRetryAfter, p.MaxTotalAge)},
		{Class: "handler_timeout", Action: fmt.Sprintf("an attempt still running %s after it started (handler timeout %s + grace %s) is abandoned, returned or not: a retryable failure (sluice.handler_timeout, its stack in the record); at %d abandoned attempts still running the handler pauses (/readyz not ready)",
			time.Duration(h.HandlerTimeout+h.AbandonGrace), h.HandlerTimeout, h.AbandonGrace, h.MaxAbandoned)},
	}
	if l := p.Learned; l != nil {
		explore := "none explored"
		if l.Explore > 0 {
			explore = fmt.Sprintf("%g%% still retried to explore", l.Explore*100)
		}
		out = append(out, ClassAction{Class: "retry_unlikely", Action: fmt.Sprintf(
			"a retryable error type with at least %d retried messages ended in the window, below %g%% recovered, is dead-lettered at once (%s)",
			l.MinEvidence, l.UnlikelyBelow*100, explore)})
	}
	if b := p.Budget; b != nil && b.WhenSpent != "no budget" {
		out = append(out, ClassAction{Class: "retry_budget_exhausted", Action: fmt.Sprintf(
			"a retry past the dependency's budget (%g of first attempts over %s, at least %g/s) is %s", b.Ratio, b.Window, b.MinRetriesPerSecond, b.WhenSpent)})
	}
	if b := h.Breaker; b != nil {
		action := "the handler pauses (stops taking deliveries, /readyz not ready) until the breaker lets probes through"
		if b.WhileOpen == "defer" {
			action = "each message is deferred through the delay without using an attempt, until the breaker lets it through"
		}
		out = append(out, ClassAction{Class: "breaker_open", Action: action})
	}
	return out
}

// judge returns the learned policy's verdict on an error type, nil without one.
func (s *Stack) judge() retrystats.Judge {
	l := s.retry.Config().Learned
	if l == nil {
		return nil
	}
	return func(t retrystats.TypeStats) retrystats.Verdict {
		v := s.retry.LearnedView(t.Handler, t.ErrorType)
		out := retrystats.Verdict{Reason: v.Reason, ShortenTo: v.ShortenTo}
		switch {
		case t.ErrorType == retrystats.OtherType || v.Other:
			out.Decision = retrystats.DecisionNotJudged
		case v.Stopped:
			out.Decision, out.Evidence = retrystats.DecisionStop, v.Evidence().String()
			out.Exploring, out.Explore, out.Probe = l.Explore > 0, l.Explore, v.Probe
		case v.Ended < l.MinEvidence:
			out.Decision = retrystats.DecisionNotEnoughEvidence
		default:
			out.Decision, out.Evidence = retrystats.DecisionRetry, v.Evidence().String()
		}
		return out
	}
}

// RetryReport returns the retry step's statistics (Config.Retry.Stats, or the ones the
// learned policy keeps) with the learned policy's verdicts; false when it keeps none.
func (s *Stack) RetryReport() (retrystats.Report, bool) {
	stats := s.retry.Stats()
	if stats == nil {
		return retrystats.Report{}, false
	}
	r := stats.Report(s.judge())
	if l := s.retry.Config().Learned; l != nil {
		r.Learned = &retrystats.LearnedSettings{MinEvidence: l.MinEvidence, UnlikelyBelow: l.UnlikelyBelow, Explore: l.Explore, Shorten: l.Shorten}
	}
	return r, true
}

// consumes records that Watermill handler name consumes queue (Describe reads it); s.mu is
// held.
func (s *Stack) consumes(name, queue string) {
	if s.topics == nil {
		s.topics = map[string]string{}
	}
	s.topics[name] = queue
}
