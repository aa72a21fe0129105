package describe

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/policy"
)

// Judge returns the learned policy's verdict on an error type, nil without one.
func Judge(r *retry.Retry) retrystats.Judge {
	l := r.Config().Learned
	if l == nil {
		return nil
	}
	return func(t retrystats.TypeStats) retrystats.Verdict {
		v := r.LearnedView(t.Handler, t.ErrorType)
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

// RetryReport returns the retry step's statistics (Config.Stats, or the ones the learned
// policy keeps) with the learned policy's verdicts; false when it keeps none.
func RetryReport(r *retry.Retry) (retrystats.Report, bool) {
	stats := r.Stats()
	if stats == nil {
		return retrystats.Report{}, false
	}
	rep := stats.Report(Judge(r))
	if l := r.Config().Learned; l != nil {
		rep.Learned = &retrystats.LearnedSettings{MinEvidence: l.MinEvidence, UnlikelyBelow: l.UnlikelyBelow, Explore: l.Explore, Shorten: l.Shorten}
	}
	return rep, true
}

// PolicyHandler serves describe's description on GET: JSON, or Markdown with
// ?format=markdown (or an Accept header asking for text/markdown).
func PolicyHandler(describe func() policy.Description) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		d := describe()
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

// RetriesHandler serves RetryReport as JSON on GET (?handler=H: H's rows only); nil when
// the retry step keeps no statistics (neither Config.Stats nor Config.Learned).
func RetriesHandler(r *retry.Retry) http.Handler {
	if r.Stats() == nil {
		return nil
	}
	return retrystats.ReportHandler(func() retrystats.Report {
		rep, _ := RetryReport(r)
		return rep
	})
}
