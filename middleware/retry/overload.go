package retry

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Span attributes of the overload events.
const (
	attrDependency = attribute.Key("sluice.dependency")
	attrReason     = attribute.Key("sluice.retry.refused_reason")
	attrMaxRetries = attribute.Key("sluice.retry.max_retries")
	attrFactor     = attribute.Key("sluice.retry.delay_factor")
	attrFailRatio  = attribute.Key("sluice.dependency.failure_ratio")
	attrBacklog    = attribute.Key("sluice.queue.backlog")
)

// call runs h for one attempt. It is the overload protection's admission gate: a first
// attempt deposits into its dependency's budget as it arrives (every request earns retries,
// as in Finagle's retry budget, whatever it ends in), and a retry past MaxConcurrentRetries
// is deferred without calling h. What the attempt ended in reaches the protection through
// Observe, like every other observer of outcomes.
func (r *Retry) call(h message.HandlerFunc, msg *message.Message, dep string) ([]*message.Message, error) {
	o := r.cfg.Overload
	if o == nil {
		return h(msg)
	}
	d := o.dependency(dep)
	if sluice.RetryCount(msg.Metadata) > 0 {
		if o.cfg.MaxConcurrentRetries > 0 {
			if d.retrying.Add(1) > int64(o.cfg.MaxConcurrentRetries) {
				d.retrying.Add(-1)
				o.refused(msg.Context(), d, msg, RefusedConcurrency, false)
				return nil, sluice.Defer(o.cfg.ConcurrencyDelay, fmt.Errorf("%w: %d already running against dependency %q",
					ErrRetryConcurrency, o.cfg.MaxConcurrentRetries, d.name))
			}
			defer d.retrying.Add(-1)
		}
	} else {
		d.win.add(o.cfg.Now(), counts{first: 1})
	}
	d.inFlight.Add(1)
	defer d.inFlight.Add(-1)
	return h(msg)
}

// Observe is the overload protection as a disposition.Observer (the retry step gives it
// every outcome it carries out): an acked attempt and a retryable failure, retried or
// dead-lettered, feed the dependency's failure ratio. A deferral, a permanent failure and
// a give-back (a failed hand-off, a paused breaker, a stopping consumer) say nothing
// about the dependency's health and are not counted.
func (o *Overload) Observe(_ context.Context, out disposition.Outcome) {
	var c counts
	switch d := out.Disposition; d.Kind {
	case disposition.Ack:
		c.attempts = 1
	case disposition.Retry, disposition.DeadLetter:
		if sluice.ClassOf(d.Reason) != sluice.ClassRetryable {
			return
		}
		c.attempts, c.failures = 1, 1
	default:
		return
	}
	o.dependency(out.Dependency).win.add(o.cfg.Now(), c)
}

// plan returns the retry plan of a failed attempt: the step's own, adapted by the policy.
func (r *Retry) plan(ctx context.Context, queue, dep string) Adjustment {
	plan := Adjustment{MaxRetries: r.cfg.MaxRetries, DelayFactor: 1, MaxDelay: r.cfg.MaxDelay}
	o := r.cfg.Overload
	if o == nil || o.cfg.Policy == nil {
		return plan
	}
	d := o.dependency(dep)
	sum := d.win.sum(o.cfg.Now())
	load := Load{
		Dependency: d.name,
		Queue:      queue,
		Attempts:   sum.attempts,
		Backlog:    o.backlog(ctx, queue),
		InFlight:   int(d.inFlight.Load()) + 1,
	}
	if sum.attempts > 0 {
		load.FailureRatio = float64(sum.failures) / float64(sum.attempts)
	}
	adj := o.cfg.Policy.Adjust(load, plan)
	// The policy may only be gentler on the dependency than the step's settings.
	adj.MaxRetries = min(max(adj.MaxRetries, 0), plan.MaxRetries)
	if adj.DelayFactor <= 0 {
		adj.DelayFactor = 1
	}
	if adj.MaxDelay <= 0 || adj.MaxDelay > plan.MaxDelay {
		adj.MaxDelay = plan.MaxDelay
	}
	if changed := adj != plan; d.adapted.set(changed, o.cfg.Now(), o.cfg.Window/windowBuckets) {
		if changed {
			o.cfg.Logger.Warn("retries adapted to load", "dependency", d.name, "max_retries", adj.MaxRetries,
				"delay_factor", adj.DelayFactor, "max_delay", adj.MaxDelay,
				"failure_ratio", load.FailureRatio, "backlog", load.Backlog, "in_flight", load.InFlight)
		} else {
			o.cfg.Logger.Info("retries back to the step's policy", "dependency", d.name,
				"failure_ratio", load.FailureRatio, "backlog", load.Backlog)
		}
	}
	if adj != plan {
		trace.SpanFromContext(ctx).AddEvent("retry.adapted", trace.WithAttributes(
			attrDependency.String(d.name),
			attrMaxRetries.Int(adj.MaxRetries),
			attrFactor.Float64(adj.DelayFactor),
			attrFailRatio.Float64(load.FailureRatio),
			attrBacklog.Int(load.Backlog),
		))
	}
	return adj
}

// admit takes the retry from the budget. Within it the delay stands; past it the delay is
// the plan's cap, or, with ExhaustedToDLQ, the message goes to the dead-letter queue.
func (r *Retry) admit(ctx context.Context, msg *message.Message, delay time.Duration, plan Adjustment, err error, dep string) (time.Duration, error) {
	o := r.cfg.Overload
	if o == nil {
		return delay, nil
	}
	d := o.dependency(dep)
	if o.withdraw(d) {
		return delay, nil
	}
	o.refused(ctx, d, msg, RefusedBudget, o.cfg.ExhaustedToDLQ)
	if o.cfg.ExhaustedToDLQ {
		return 0, &budgetExhaustedError{Dependency: d.name, Err: err}
	}
	return max(delay, plan.MaxDelay), nil
}

// stretch applies the plan's factor and cap to a backoff delay.
func stretch(delay time.Duration, plan Adjustment) time.Duration {
	if plan.DelayFactor != 1 {
		delay = time.Duration(float64(delay) * plan.DelayFactor)
	}
	return min(delay, plan.MaxDelay)
}

func (o *Overload) refused(ctx context.Context, d *dependency, msg *message.Message, reason string, dead bool) {
	trace.SpanFromContext(ctx).AddEvent("retry.refused", trace.WithAttributes(
		attrDependency.String(d.name),
		attrReason.String(reason),
	))
	o.cfg.Logger.Debug("retry refused", "dependency", d.name, "reason", reason, "message_id", msg.UUID, "dead_letter", dead)
	ev := RefusedEvent{
		Dependency: d.name, Queue: message.SubscribeTopicFromCtx(ctx), MessageID: msg.UUID,
		Reason: reason, DeadLettered: dead,
	}
	if o.cfg.OnRefused != nil {
		o.cfg.OnRefused(ev)
	}
	o.mu.Lock()
	listeners := o.listeners
	o.mu.Unlock()
	for _, f := range listeners {
		(*f)(ev)
	}
}
