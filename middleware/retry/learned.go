package retry

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/retrystats"
)

// Defaults of Learned's zero fields.
const (
	// defaultMinEvidence is how many retried messages of an error type must have ended in
	// the window before the learned policy judges it.
	defaultMinEvidence = 50
	// defaultUnlikelyBelow is the recovery rate below which retrying stops.
	defaultUnlikelyBelow = 0.01
	// defaultExplore is the share of a stopped type's messages still retried.
	defaultExplore = 0.05
)

// HeaderProbe marks a message the learned policy chose as a stopped error type's probe
// (see Learned): the retry step writes it, with the error type as its value, on the retry
// copies of that message, so that the instance its next attempt reaches explores it too. It
// is honoured only on a message whose trip headers are sluice's own retry state (at least
// one attempt made by sluice; package internal/headers' ReadTrip), and removed from the
// retry copy of any other: a producer's value on a fresh message is no mark.
const HeaderProbe = "x-sluice-probe"

// probeGrace is what a probe's lease adds to twice its retry delay: the time the delay and
// the queue may take beyond the delay itself before the policy stops waiting for the probe
// (its next attempt went to another instance, or it was lost with a crash) and picks the
// next message as probe.
const probeGrace = time.Second

// NoExplore, as Learned.Explore, turns exploration off: every message of a stopped error
// type is dead-lettered. Zero cannot say this, since it means the default of 5%.
const NoExplore = -1.0

// Span event and attributes of the learned policy's decision.
const (
	eventUnlikely = "sluice.retry.unlikely"
	attrErrorType = attribute.Key("error.type")
	attrRecovered = attribute.Key("sluice.retry.evidence.recovered")
	attrEnded     = attribute.Key("sluice.retry.evidence.ended")
	attrEvidence  = attribute.Key("sluice.retry.evidence")
)

// Learned is the learned retry policy (Config.Learned): it stops retrying an error type
// whose retries have not been paying off, judged per handler from the step's own outcome
// statistics (Config.Stats, package retrystats) over their window.
//
// For a retryable failure whose error type has at least MinEvidence retried messages
// that ended in the window, of which a share below UnlikelyBelow recovered, the message is
// dead-lettered at once (disposition.Policy.Unlikely): its reason is a
// *decide.UnlikelyError (errors.Is disposition.ErrRetryUnlikely) whose text carries
// the evidence ("retry_unlikely: 0 of 312 recovered in the last hour (error type X): ..."),
// and the record keeps the handler error's type and class, so it replays like any other
// dead letter. The decision is a span event (sluice.retry.unlikely), a metric
// (sluice_retry_outcomes_total{outcome="retry_unlikely"}) and a log line whenever a type
// stops or resumes being retried.
//
// Its safety rules: it never retries what the base policy would not (a Permanent error
// is dead-lettered as before, a Discard discarded, a Defer deferred); it never drops a
// message (it only dead-letters); it does not judge a type with fewer than MinEvidence
// ended messages, nor the types counted together as retrystats.OtherType; and it keeps
// exploring: a share Explore of a stopped type's messages (chosen by message id, so a
// message is explored on all its attempts) still follows the base policy, so a dependency
// that heals shows in their recoveries and the type is retried again. Once stopped, a type
// stays stopped while its explored messages show no recovery, even when the window then
// holds fewer than MinEvidence ended messages (its own dead letters are no evidence); with
// NoExplore it is judged afresh then.
//
// It keeps a probe in flight, at most half the time. The hashed share alone notices a fix only when one of its
// messages next fails and is retried: with 5%, about 1/0.05 − 1 = 19 messages of the type
// are dead-lettered after the fix before an explored one arrives, plus those arriving while
// it waits out its retry delay, which a busy type pays in recoverable dead letters. So
// while a type is stopped and none of its explored messages is in its retry path in this
// process, the next message of the type is explored too (in addition to the hashed share):
// the probe. Its retry copies carry HeaderProbe, so it follows the base policy on all its
// attempts, whichever instance they reach, and a fix is noticed within one retry delay
// while a probe is in flight, within one schedule and one delay at worst, instead of after
// about 1/Explore messages. A probe that ends
// without recovering is followed by a rest as long as it was in flight, so a probe is in
// flight at most half the time: its cost while the dependency stays broken is at most half
// of one message's base-policy retries per schedule length, per instance and stopped type
// (with the default 1 s to 16 s schedule, 5 retries a minute), whatever the traffic.
// "In its retry path" is a lease, not a timer: the explored message it names holds it
// until its next attempt is due (twice its retry delay plus a second); the lease ends when
// that message recovers or (after the rest) is dead-lettered here, and lapses when its
// next attempt went to another instance (which takes up the probe there) or was lost. A
// producer that forges HeaderProbe together with consistent retry headers gets its message the base
// policy's retries, which it can get from the hashed share by its choice of message id, and
// changes nothing about where the message goes. Explore = NoExplore turns probes off too.
//
// Its state is bounded: one lease (a message id and two times) per stopped error type of
// each handler, at most the statistics' MaxTypes per handler; it holds no goroutine or
// timer. Opt-in, Shorten also cuts a retried type's schedule to the attempt by which 99%
// of its recoveries came.
//
// The zero value uses the defaults named on each field.
type Learned struct {
	// MinEvidence is how many messages retried after failing with an error type must have
	// ended (recovered or dead-lettered) in the window before the policy judges the type.
	// Zero means 50.
	MinEvidence int64
	// UnlikelyBelow is the recovery rate (recovered over ended) below which retrying
	// stops. Zero means 0.01 (1%).
	UnlikelyBelow float64
	// Explore is the share of a stopped type's messages that still follow the base
	// policy. Zero means 0.05 (5%); NoExplore (any negative) means none.
	Explore float64
	// Shorten, when true, cuts the schedule of an error type that is retried (not stopped)
	// to the attempt by which 99% of its recoveries in the window came
	// (retrystats.TypeStats.RecoveryAttempt(0.99)), once the window holds at least
	// MinShortenRecoveries of them: a message that fails at that attempt is dead-lettered
	// with reason retry_unlikely, its reason a *ShortenedError that names the cut and the
	// evidence, instead of being retried further. It never cuts below that attempt, never
	// lengthens the base schedule, and leaves a stopped type's explored messages to the
	// base policy. False, the zero value, keeps the base schedule for every type.
	Shorten bool
}

// MinShortenRecoveries is how many recoveries of an error type the window must hold
// before Learned.Shorten cuts its schedule: with fewer, the 99th percentile of the
// recovery attempt is the latest recovery seen, or close to it, and says little.
const MinShortenRecoveries = 100

func (l *Learned) setDefaults() error {
	if l.MinEvidence == 0 {
		l.MinEvidence = defaultMinEvidence
	}
	if l.MinEvidence < 1 {
		return fmt.Errorf("retry: Learned.MinEvidence %d must be at least 1", l.MinEvidence)
	}
	if l.UnlikelyBelow == 0 {
		l.UnlikelyBelow = defaultUnlikelyBelow
	}
	if l.UnlikelyBelow < 0 || l.UnlikelyBelow >= 1 {
		return fmt.Errorf("retry: Learned.UnlikelyBelow %v must be in (0, 1)", l.UnlikelyBelow)
	}
	if l.Explore == 0 {
		l.Explore = defaultExplore
	} else if l.Explore < 0 {
		l.Explore = 0
	}
	if l.Explore >= 1 {
		return fmt.Errorf("retry: Learned.Explore %v must be below 1", l.Explore)
	}
	return nil
}

// learner applies a Learned policy over the step's statistics. It is the step's observer
// of the statistics (Observe), so that the outcome of a probe ends its lease.
type learner struct {
	cfg    Learned
	stats  *retrystats.Stats
	logger *slog.Logger
	now    func() time.Time

	// nStopped is len(stopped), read without mu: Observe takes the lock only while some
	// type is stopped.
	nStopped atomic.Int32
	mu       sync.Mutex
	stopped  map[learnKey]*lease // the types judged unlikely, for the log line on a change, and their probe
}

type learnKey struct{ handler, errType string }

// lease is a stopped type's probe: the explored message in its retry path (id), since
// when, and until when the next message cannot become the probe: while id is set, when
// the policy stops waiting for its next attempt; once it ended without recovering, the
// end of the rest before the next probe. The lease is free from until on.
type lease struct {
	id           string
	since, until time.Time
}

// leaseFor is how long after a hand-off with delay d its message holds a probe's lease.
func leaseFor(d time.Duration) time.Duration { return 2*d + probeGrace }

// View is what the learned policy makes of one handler's error type now.
type View struct {
	retrystats.TypeStats
	// Stopped is true when the policy dead-letters the type's messages (but the explored
	// share and the probe).
	Stopped bool
	// Probe is the id of the explored message whose retry path holds the stopped type's
	// probe lease in this process, "" when none does: the next message of the type becomes
	// the probe, from NextProbe on.
	Probe string
	// NextProbe, when Probe is "" and the last probe ended without recovering, is the end
	// of the rest before the next probe; zero when the next message is the probe.
	NextProbe time.Time
	// ShortenTo is the attempt Learned.Shorten cuts the type's schedule to, 0 when it does
	// not (off, too few recoveries, stopped, or the cut is no shorter than anything seen).
	ShortenTo int
	// Reason says why, or why not, in a sentence.
	Reason string
}

// view judges handler's errType.
func (l *learner) view(handler, errType string) View {
	ts := l.stats.Type(handler, errType)
	v := View{TypeStats: ts}
	switch {
	case errType == retrystats.OtherType || ts.Other:
		v.Reason = "not judged: counted with other types past the statistics' MaxTypes"
	case ts.Ended < l.cfg.MinEvidence && l.cfg.Explore > 0 && l.isStopped(handler, errType) && ts.RecoveryRate() < l.cfg.UnlikelyBelow:
		// Its own dead letters are no evidence, so once stopped the window thins to the
		// explored messages: they alone decide until one recovers. Judging the type
		// afresh would spend MinEvidence more messages' retries every window.
		v.Stopped = true
		v.Reason = fmt.Sprintf("dead-lettered at once (%.0f%% explored): no recovery among the explored messages since it stopped: %s",
			l.cfg.Explore*100, ts.Evidence())
	case ts.Ended < l.cfg.MinEvidence:
		v.Reason = fmt.Sprintf("retried: too little evidence (%d of %d messages needed ended in the window)", ts.Ended, l.cfg.MinEvidence)
	case ts.RecoveryRate() >= l.cfg.UnlikelyBelow:
		v.Reason = fmt.Sprintf("retried: %s", ts.Evidence())
	default:
		v.Stopped = true
		v.Reason = fmt.Sprintf("dead-lettered at once (%.0f%% explored): %s", l.cfg.Explore*100, ts.Evidence())
	}
	if n := l.shortenTo(v); n > 0 {
		v.ShortenTo = n
		v.Reason += fmt.Sprintf("; schedule shortened to attempt %d, by which 99%% of %d recoveries came", n, ts.Recovered)
	}
	return v
}

// shortenTo returns the attempt Learned.Shorten cuts v's type to, 0 for none.
func (l *learner) shortenTo(v View) int {
	if !l.cfg.Shorten || v.Stopped || v.Other || v.ErrorType == retrystats.OtherType || v.Recovered < MinShortenRecoveries {
		return 0
	}
	n := v.RecoveryAttempt(0.99)
	if n > retrystats.AttemptBins {
		return 0 // the last bin counts attempt AttemptBins+1 and later: no cut is known safe
	}
	return n
}

// learnedPlan is what the learned policy makes of one failure: the evidence that retrying
// is unlikely to help, or the attempt its type's schedule is cut to.
type learnedPlan struct {
	unlikely *decide.Evidence
	view     View
}

func (l *learner) isStopped(handler, errType string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopped[learnKey{handler, errType}] != nil
}

// probe returns the id of the message holding handler's errType's probe lease at now, ""
// when none, and the end of the rest before the next probe, zero when the lease is free.
func (l *learner) probe(handler, errType string, now time.Time) (string, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.stopped[learnKey{handler, errType}]
	if p == nil || !now.Before(p.until) {
		return "", time.Time{}
	}
	if p.id != "" {
		return p.id, time.Time{}
	}
	return "", p.until
}

// judge returns the plan for msg's failure with errType at now: the evidence that
// retrying is unlikely to help, or none to retry as the base policy says (within the
// schedule Shorten cuts). It writes msg's probe mark
// (HeaderProbe), which its retry copy carries: set when msg becomes a stopped type's
// probe, kept when sluice set it on an earlier attempt, removed when it is not sluice's.
func (l *learner) judge(ctx context.Context, handler, errType string, msg *message.Message, now time.Time) learnedPlan {
	marked := probeMarked(msg.Metadata)
	v := l.view(handler, errType)
	l.note(handler, errType, v)
	if !v.Stopped || l.cfg.Explore <= 0 {
		return learnedPlan{unlikely: l.stop(ctx, v), view: v}
	}
	if l.explore(learnKey{handler, errType}, msg, marked, now) {
		return learnedPlan{}
	}
	return learnedPlan{unlikely: l.stop(ctx, v), view: v}
}

// probeMarked reports whether md carries a probe mark sluice wrote, and removes one it did
// not: a mark counts only on a message whose trip headers are sluice's own retry state.
func probeMarked(md message.Metadata) bool {
	if md.Get(HeaderProbe) == "" {
		return false
	}
	if trip := headers.ReadTrip(md); trip.Carried && trip.Made > 0 {
		return true
	}
	delete(md, HeaderProbe)
	return false
}

// explore reports whether msg of the stopped type k follows the base policy: it is in
// the hashed share, or marked as a probe, or it becomes the probe because no explored
// message holds k's lease at now. An explored message takes a free lease, so that while
// one is in its retry path no probe is added.
func (l *learner) explore(k learnKey, msg *message.Message, marked bool, now time.Time) bool {
	hashed := explored(msg.UUID, l.cfg.Explore)
	l.mu.Lock()
	p := l.stopped[k]
	free := p != nil && !now.Before(p.until)
	if free {
		// The hand-off (Observe) sets the lease's end from the retry delay; until then it
		// covers the decision and the hand-off.
		p.id, p.since, p.until = msg.UUID, now, now.Add(probeGrace)
	}
	l.mu.Unlock()
	switch {
	case hashed || marked:
		return true
	case free:
		msg.Metadata.Set(HeaderProbe, k.errType)
		return true
	}
	return false
}

// stop returns the evidence of a stopped view v, recorded as a span event; nil when v is
// not stopped.
func (l *learner) stop(ctx context.Context, v View) *decide.Evidence {
	if !v.Stopped {
		return nil
	}
	ev := v.Evidence()
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		span.AddEvent(eventUnlikely, trace.WithAttributes(attrErrorType.String(v.ErrorType), attrRecovered.Int64(ev.Recovered),
			attrEnded.Int64(ev.Ended), attrEvidence.String(ev.String())))
	}
	return &ev
}

// note logs a type's change between retried and stopped.
func (l *learner) note(handler, errType string, v View) {
	k := learnKey{handler, errType}
	l.mu.Lock()
	was := l.stopped[k] != nil
	if was == v.Stopped {
		l.mu.Unlock()
		return
	}
	if v.Stopped {
		l.stopped[k] = &lease{}
	} else {
		delete(l.stopped, k)
	}
	l.nStopped.Store(int32(len(l.stopped)))
	l.mu.Unlock()
	if v.Stopped {
		l.logger.Warn("retries stopped for an error type that does not recover", "handler", handler, "error_type", errType,
			"evidence", v.Evidence().String(), "explore", l.cfg.Explore)
		return
	}
	l.logger.Info("retries resumed for an error type", "handler", handler, "error_type", errType, "reason", v.Reason)
}

// Observe counts o in the statistics and ends or extends the probe lease o's message holds
// (disposition.Observer): a retry holds it until its next attempt is due, a recovery frees
// it, any other end frees it after a rest as long as the message held it. A first attempt
// that succeeded returns at once, as the statistics do.
func (l *learner) Observe(ctx context.Context, o disposition.Outcome) {
	if o.RetriedErrorType == "" && o.Disposition.Kind == disposition.Ack {
		return // the success path of a message that never failed
	}
	l.stats.Observe(ctx, o)
	if l.nStopped.Load() == 0 {
		return
	}
	switch o.Disposition.Kind {
	case disposition.Defer, disposition.Duplicate:
		return // no attempt made: the lease stands as it was
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	// A handful of stopped types at most: looking at each beats an index by message id.
	for k, p := range l.stopped {
		if p.id != o.MessageID || k.handler != o.Handler {
			continue
		}
		switch o.Disposition.Kind {
		case disposition.Retry:
			p.until = now.Add(leaseFor(o.Disposition.Delay))
		case disposition.Ack:
			p.id, p.until = "", now
		default:
			// Ended without recovering: rest as long as it was in flight, so that a probe is
			// in flight at most half the time a type is stopped.
			p.id, p.until = "", now.Add(now.Sub(p.since))
		}
	}
}

// explored reports whether message id falls in the explored share: an FNV-1a hash of the
// id, so that a message is explored (or not) on every attempt, whatever the process.
func explored(id string, share float64) bool {
	if share <= 0 {
		return false
	}
	h := uint32(2166136261)
	for i := 0; i < len(id); i++ {
		h ^= uint32(id[i])
		h *= 16777619
	}
	return float64(h%10000) < share*10000
}

// LearnedView returns what the learned policy makes of handler's errType now; without
// Config.Learned, Stopped is false and Reason says so.
func (r *Retry) LearnedView(handler, errType string) View {
	if r.learner == nil {
		v := View{Reason: "retried: no learned policy"}
		if r.cfg.Stats != nil {
			v.TypeStats = r.cfg.Stats.Type(handler, errType)
		}
		return v
	}
	v := r.learner.view(handler, errType)
	if v.Stopped && r.learner.cfg.Explore > 0 {
		v.Probe, v.NextProbe = r.learner.probe(handler, errType, r.cfg.Now())
	}
	return v
}

// Stats returns the outcome statistics the step feeds (Config.Stats, or the ones New made
// for Config.Learned); nil when neither was set.
func (r *Retry) Stats() *retrystats.Stats { return r.cfg.Stats }
