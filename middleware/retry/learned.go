package retry

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/retrystats"
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
// *disposition.UnlikelyError (errors.Is disposition.ErrRetryUnlikely) whose text carries
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
}

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

// learner applies a Learned policy over the step's statistics.
type learner struct {
	cfg    Learned
	stats  *retrystats.Stats
	logger *slog.Logger

	mu      sync.Mutex
	stopped map[learnKey]bool // the types judged unlikely, for the log line on a change
}

type learnKey struct{ handler, errType string }

// View is what the learned policy makes of one handler's error type now.
type View struct {
	retrystats.TypeStats
	// Stopped is true when the policy dead-letters the type's messages (but the explored
	// share).
	Stopped bool
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
	return v
}

func (l *learner) isStopped(handler, errType string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopped[learnKey{handler, errType}]
}

// judge returns the evidence that retrying the failure of msgID with errType is unlikely
// to help, or nil to retry as the base policy says.
func (l *learner) judge(ctx context.Context, handler, errType, msgID string) *disposition.Evidence {
	v := l.view(handler, errType)
	l.note(handler, errType, v)
	if !v.Stopped || explored(msgID, l.cfg.Explore) {
		return nil
	}
	ev := v.Evidence()
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		span.AddEvent(eventUnlikely, trace.WithAttributes(attrErrorType.String(errType), attrRecovered.Int64(ev.Recovered),
			attrEnded.Int64(ev.Ended), attrEvidence.String(ev.String())))
	}
	return &ev
}

// note logs a type's change between retried and stopped.
func (l *learner) note(handler, errType string, v View) {
	k := learnKey{handler, errType}
	l.mu.Lock()
	was := l.stopped[k]
	if was == v.Stopped {
		l.mu.Unlock()
		return
	}
	if v.Stopped {
		l.stopped[k] = true
	} else {
		delete(l.stopped, k)
	}
	l.mu.Unlock()
	if v.Stopped {
		l.logger.Warn("retries stopped for an error type that does not recover", "handler", handler, "error_type", errType,
			"evidence", v.Evidence().String(), "explore", l.cfg.Explore)
		return
	}
	l.logger.Info("retries resumed for an error type", "handler", handler, "error_type", errType, "reason", v.Reason)
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
	return r.learner.view(handler, errType)
}

// Stats returns the outcome statistics the step feeds (Config.Stats, or the ones New made
// for Config.Learned); nil when neither was set.
func (r *Retry) Stats() *retrystats.Stats { return r.cfg.Stats }
