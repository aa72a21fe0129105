package router

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/sluice-go/sluice/internal/describe"
	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/policy"
)

// Describe returns what the stack does with each handler's failures, from the settings in
// force (package policy). It can be called at any time, before Run, while running or after
// Close.
//
// What the stack does not record of a handler's options is left out or inferred: the
// breaker's trip thresholds are left out (breaker.Registry keeps its Config to itself,
// said in Notes); the dependency a WithBreaker option names is inferred from the
// registry's breakers (see policy.BreakerDescription.Dependency); whether a handler gave
// WithIdempotencyKey is known for journaled steps only.
func (s *Stack) Describe() policy.Description {
	s.mu.Lock()
	in := describe.Inputs{
		Names: slices.Collect(maps.Keys(s.names)), Topics: maps.Clone(s.topics), Native: maps.Clone(s.native),
		Pausing: map[string]bool{}, Retry: s.retry.Config(), Judge: s.judge(), Stats: s.retry.Stats(), Breakers: s.cfg.Breakers,
		HandlerTimeout: s.cfg.HandlerTimeout, AbandonGrace: s.cfg.AbandonGrace, MaxAbandoned: s.cfg.MaxAbandoned, Settle: maps.Clone(s.settle),
		Compensations: maps.Clone(s.compensations),
	}
	for handler := range s.parts.Paused() {
		in.Pausing[handler] = true
	}
	for _, sl := range s.slots {
		in.Journals = append(in.Journals, describe.Journal{Queue: sl.Queue(), WithKey: sl.WithKey()})
	}
	s.mu.Unlock()
	if o := in.Retry.Overload; o != nil {
		in.BudgetLeft = o.BudgetLeft
	}
	if s.cfg.Idempotency != nil {
		in.Idempotency = fmt.Sprintf("%T", s.cfg.Idempotency)
	}
	return describe.Build(in)
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

// retryReport returns the retry step's statistics (Config.Retry.Stats, or the ones the
// learned policy keeps) with the learned policy's verdicts; false when it keeps none.
func (s *Stack) retryReport() (retrystats.Report, bool) {
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

// policyHandler serves Describe on GET: JSON, or Markdown with ?format=markdown (or an
// Accept header asking for text/markdown).
func (s *Stack) policyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		d := s.Describe()
		switch f := req.URL.Query().Get("format"); {
		case f == "markdown" || f == "md" || (f == "" && strings.Contains(req.Header.Get("Accept"), "text/markdown")):
			w.Header().Set("Content-Type", "text/markdown; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			_, _ = w.Write([]byte(d.Markdown()))
		case f == "" || f == "json":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			_ = enc.Encode(d)
		default:
			http.Error(w, fmt.Sprintf("unknown format %q: want json or markdown", f), http.StatusBadRequest)
		}
	})
}

// retriesHandler serves retryReport as JSON on GET (?handler=H: H's rows only); nil when
// the retry step keeps no statistics (neither Config.Retry.Stats nor Config.Retry.Learned).
func (s *Stack) retriesHandler() http.Handler {
	if s.retry.Stats() == nil {
		return nil
	}
	return retrystats.ReportHandler(func() retrystats.Report {
		r, _ := s.retryReport()
		return r
	})
}
