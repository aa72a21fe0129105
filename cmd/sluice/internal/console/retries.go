package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice/cmd/sluice/internal/retryview"
	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/policy"
)

// defaultRetriesWindow is the window the retry pages count over when they read Prometheus
// and the request names none (?window=), as `sluice retries --window` defaults to.
const defaultRetriesWindow = time.Hour

// learnedLookupTimeout bounds the extra read of the service's learned view when the
// statistics come from Prometheus: the page must not wait the whole read timeout for a
// column that is a complement.
const learnedLookupTimeout = 3 * time.Second

// RetryRow is one error type of a handler as the retry pages show it: the counts of
// retrystats.TypeReport formatted, and what the learned policy makes of the type.
type RetryRow struct {
	ErrorType string
	Failed    int64
	Retries   int64
	// InFlight is "–" when the source does not know it (Prometheus).
	InFlight      string
	Recovered     int64
	RecoveredPct  string
	MedianAttempt string
	Exhausted     int64
	Permanent     int64
	RetryUnlikely int64
	OtherEnds     int64
	// Learned is the learned policy's decision in words ("stop retrying (exploring 5%)"),
	// Why its evidence or reason; both empty without a learned policy. Stopped marks a
	// type whose retries the policy stopped.
	Learned string
	Why     string
	Stopped bool
}

// HandlerRetries is one handler's section of the retry pages.
type HandlerRetries struct {
	Name string
	Rows []RetryRow
	// Totals over the rows, for the overview's summary line.
	Failed, Retries, Recovered, Ended int64
	RecoveredPct                      string
}

// retrySource is where the retry pages read, from Config.ServiceURL and PrometheusURL.
func (s *Server) retrySource() retryview.Source {
	return retryview.Source{ServiceURL: s.cfg.ServiceURL, PrometheusURL: s.cfg.PrometheusURL}
}

// retriesWindow reads ?window= (a Go duration of at least 1s), else the default.
func retriesWindow(r *http.Request) (time.Duration, error) {
	w := r.URL.Query().Get("window")
	if w == "" {
		return defaultRetriesWindow, nil
	}
	d, err := time.ParseDuration(w)
	if err != nil || d < time.Second {
		return 0, fmt.Errorf("window %q is not a duration of at least 1s (e.g. 1h, 30m): %w", w, ErrBadRequest)
	}
	return d, nil
}

// retries reads the statistics of handler ("" for all). From Prometheus, which does not
// know the learned policy's verdicts, it fills them in from the service's decision matrix
// when the service answers in time; note says where they came from or why they are
// missing.
func (s *Server) retries(ctx context.Context, handler string, window time.Duration) (rep retryview.Retries, note string, err error) {
	src := s.retrySource()
	rep, err = src.Retries(ctx, handler, window)
	if err != nil || rep.Source != retryview.SourcePrometheus {
		return rep, "", err
	}
	lctx, cancel := context.WithTimeout(ctx, learnedLookupTimeout)
	defer cancel()
	pol, perr := src.Policy(lctx)
	if perr != nil {
		return rep, "The learned policy's view is the service's own and could not be read: " + s.mask(perr.Error()), nil
	}
	found := false
	for i, t := range rep.Types {
		h, ok := pol.Handler(t.Handler)
		if !ok {
			continue
		}
		for _, v := range h.Learned {
			if v.ErrorType == t.ErrorType {
				rep.Types[i].Learned = &v.Verdict
				found = true
			}
		}
		if rep.Learned == nil && h.Retry.Learned != nil {
			rep.Learned = h.Retry.Learned
		}
	}
	if found || rep.Learned != nil {
		note = "The learned policy's view is the service's own, read from " + pol.URL + "."
	}
	return rep, note, nil
}

// handlerRetries groups rep's rows by handler, in rep's order.
func handlerRetries(rep retryview.Retries) []HandlerRetries {
	var out []HandlerRetries
	index := map[string]int{}
	for _, t := range rep.Types {
		i, ok := index[t.Handler]
		if !ok {
			i = len(out)
			index[t.Handler] = i
			out = append(out, HandlerRetries{Name: t.Handler})
		}
		h := &out[i]
		h.Rows = append(h.Rows, retryRow(t, rep.Source))
		h.Failed += t.Failed
		h.Retries += t.Retries
		h.Recovered += t.Recovered
		h.Ended += t.Ended
	}
	for i := range out {
		out[i].RecoveredPct = "–"
		if out[i].Ended > 0 {
			out[i].RecoveredPct = pct(100 * float64(out[i].Recovered) / float64(out[i].Ended))
		}
	}
	return out
}

func retryRow(t retrystats.TypeReport, source string) RetryRow {
	r := RetryRow{
		ErrorType: t.ErrorType, Failed: t.Failed, Retries: t.Retries, InFlight: strconv.FormatInt(t.InFlight, 10),
		Recovered: t.Recovered, RecoveredPct: "–", MedianAttempt: "–", Exhausted: t.Exhausted, Permanent: t.Permanent,
		RetryUnlikely: t.RetryUnlikely, OtherEnds: t.Discarded + t.DeadLettered,
	}
	if source == retryview.SourcePrometheus {
		r.InFlight = "–" // no metric counts retries on their way back
	}
	if t.RecoveredPct != nil {
		r.RecoveredPct = pct(*t.RecoveredPct)
	}
	if t.MedianRecoveryAttempt > 0 {
		r.MedianAttempt = strconv.Itoa(t.MedianRecoveryAttempt)
	}
	if v := t.Learned; v != nil {
		r.Learned, r.Why, r.Stopped = (*v).Text(), v.Evidence, v.Decision == retrystats.DecisionStop
		if r.Why == "" {
			r.Why = v.Reason
		}
	}
	return r
}

func pct(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) + "%" }

// learnedSettings says what the learned policy does, or "" without one.
func learnedSettings(l *retrystats.LearnedSettings) string {
	if l == nil {
		return ""
	}
	return fmt.Sprintf("stops retrying an error type below %g%% recovered, after %d ended messages; still retries %g%% of a stopped type's messages, to see it heal",
		l.UnlikelyBelow*100, l.MinEvidence, l.Explore*100)
}

// sourceFailed is how a page says its source could not be read: the status, and the
// message without anything a configured URL's password could leak through.
func (s *Server) sourceFailed(err error) (int, string) {
	code := http.StatusBadGateway
	switch {
	case errors.Is(err, ErrBadRequest):
		code = http.StatusBadRequest
	case errors.Is(err, retryview.ErrNotHTTP):
		code = http.StatusInternalServerError // the console's own configuration
	case errors.Is(err, context.DeadlineExceeded):
		code = http.StatusGatewayTimeout
	}
	return code, s.mask(err.Error())
}

func (s *Server) retriesPage(w http.ResponseWriter, r *http.Request) {
	handler := r.PathValue("handler")
	data := map[string]any{"Title": "Retries", "Handler": handler, "Source": s.retrySource().Describe(),
		"Prometheus": s.cfg.PrometheusURL != ""}
	if handler != "" {
		data["Title"] = "Retries of " + handler
	}
	window, err := retriesWindow(r)
	if err != nil {
		code, msg := s.sourceFailed(err)
		data["Error"] = msg
		s.render(w, r, code, "retries", data)
		return
	}
	data["Window"] = policy.Duration(window).String()
	ctx, cancel := s.ctx(r)
	defer cancel()
	rep, note, err := s.retries(ctx, handler, window)
	if err != nil {
		code, msg := s.sourceFailed(err)
		s.cfg.Logger.Warn("console: retry statistics unavailable", "path", r.URL.Path, "error", msg)
		data["Error"] = msg
		s.render(w, r, code, "retries", data)
		return
	}
	data["Source"] = rep.Describe()
	data["Window"] = policy.Duration(rep.WindowDuration()).String()
	data["Learned"] = learnedSettings(rep.Learned)
	data["LearnedNote"] = note
	data["Handlers"] = handlerRetries(rep)
	if handler != "" {
		// The handler's retry policy beside its numbers, when the service answers soon:
		// a complement, not worth the page's whole timeout.
		pctx, pcancel := context.WithTimeout(ctx, learnedLookupTimeout)
		defer pcancel()
		if pol, err := s.retrySource().Policy(pctx); err == nil {
			if h, ok := pol.Handler(handler); ok {
				data["Policy"] = policySummary(h)
			}
		}
	}
	s.render(w, r, http.StatusOK, "retries", data)
}

// apiRetries serves GET /api/v1/retries: the statistics as `sluice retries --json` prints
// them (?handler=H: H's rows only; ?window=D: Prometheus's window), with the learned
// policy's verdicts from the service when they came from Prometheus.
func (s *Server) apiRetries(w http.ResponseWriter, r *http.Request) {
	window, err := retriesWindow(r)
	if err != nil {
		s.apiFail(w, r, err)
		return
	}
	ctx, cancel := s.ctx(r)
	defer cancel()
	rep, note, err := s.retries(ctx, r.URL.Query().Get("handler"), window)
	if err != nil {
		code, msg := s.sourceFailed(err)
		s.writeJSON(w, code, apiError{Error: msg, Status: code})
		return
	}
	s.writeJSON(w, http.StatusOK, struct {
		retryview.Retries
		LearnedNote string `json:"learned_note,omitempty"`
	}{rep, note})
}

// PolicyRow is one row of a handler's settings on the policy page.
type PolicyRow struct {
	Name, Value string
	// Link, when set, is a console page about Value (a queue).
	Link string
}

// HandlerPolicy is one handler's decision matrix as the policy page shows it.
type HandlerPolicy struct {
	Name     string
	Settings []PolicyRow
	Classes  []policy.ClassAction
	Schedule []policy.ScheduledRetry
	// Learned is nil without a learned policy, empty when it has seen no failure.
	Learned    []policy.LearnedView
	HasLearned bool
}

// policySummary is h as the pages show it.
func policySummary(h policy.HandlerDescription) HandlerPolicy {
	p := h.Retry
	out := HandlerPolicy{Name: h.Name, Classes: h.ErrorClasses, Schedule: p.Schedule, Learned: slices.Clone(h.Learned), HasLearned: p.Learned != nil}
	// The types the policy stopped retrying first: they are what changed the handler's
	// behaviour, and what an operator looks for.
	slices.SortStableFunc(out.Learned, func(a, b policy.LearnedView) int {
		return cmp.Compare(stopRank(a.Decision), stopRank(b.Decision))
	})
	row := func(name, value, link string) { out.Settings = append(out.Settings, PolicyRow{name, value, link}) }
	queueLink := func(q string) string {
		if q == "" {
			return ""
		}
		return "/queues/" + url.PathEscape(q)
	}
	row("Queue", orUnknown(h.Queue), queueLink(h.Queue))
	if h.Partitions > 0 {
		row("Partitions", fmt.Sprintf("%d: %s", h.Partitions, strings.Join(h.Consumes, ", ")), "")
	}
	row("Dead-letter queue", orUnknown(h.DeadLetterQueue), queueLink(h.Queue))
	archive := ""
	if h.Queue != "" {
		archive = "/queues/" + url.PathEscape(h.Queue) + "?source=archive"
	}
	row("Archive", orUnknown(h.Archive), archive)
	row("Handler timeout", fmt.Sprintf("%s, abandoned %s later (grace); at most %d abandoned still running, then paused", h.HandlerTimeout, h.AbandonGrace, h.MaxAbandoned), "")
	row("Settle bound", h.SettleText(), "")
	row("Maximum attempts", fmt.Sprintf("%d (%d retries)", p.MaxAttempts, p.MaxRetries), "")
	row("Backoff", fmt.Sprintf("%s × %g up to %s, jitter ±%g%%", p.InitialDelay, p.Multiplier, p.MaxDelay, p.Jitter*100), "")
	row("Maximum total age", p.MaxTotalAge.String()+" from the first failure", "")
	row("Maximum RetryAfter / Defer", p.MaxRetryAfter.String(), "")
	if b := p.Budget; b != nil {
		v := fmt.Sprintf("%g of first attempts over %s (at least %g/s); when spent: %s", b.Ratio, b.Window, b.MinRetriesPerSecond, b.WhenSpent)
		if b.MaxConcurrentRetries > 0 {
			v += fmt.Sprintf("; at most %d concurrent retries (else deferred %s)", b.MaxConcurrentRetries, b.ConcurrencyDelay)
		}
		if b.Adaptive {
			v += "; adaptive policy"
		}
		if b.Left != nil {
			v += fmt.Sprintf("; %s has %.1f left now", b.Dependency, *b.Left)
		}
		row("Retry budget", v, "")
	} else {
		row("Retry budget", "none", "")
	}
	if b := h.Breaker; b != nil {
		v := "while open: " + b.WhileOpen
		if b.Dependency != "" {
			v = fmt.Sprintf("%s (%s), open %s then %d half-open probes; %s", b.Dependency, orUnknown(b.State), b.OpenTimeout, b.HalfOpenProbes, v)
		} else {
			v = "dependency not recorded by the stack; " + v
		}
		row("Circuit breaker", v, "")
	} else {
		row("Circuit breaker", "none", "")
	}
	if id := h.Idempotency; id != nil {
		v := id.Step + "; key: " + id.Key
		if id.Journal != "" {
			v += "; journal " + id.Journal
		}
		row("Idempotency", v, "")
	} else {
		row("Idempotency", "none", "")
	}
	if l := learnedSettings(p.Learned); l != "" {
		row("Learned policy", l, "")
	} else {
		row("Learned policy", "none", "")
	}
	return out
}

func stopRank(decision string) int {
	if decision == retrystats.DecisionStop {
		return 0
	}
	return 1
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func (s *Server) policyPage(w http.ResponseWriter, r *http.Request) {
	handler := r.PathValue("handler")
	src := s.retrySource()
	data := map[string]any{"Title": "Retry policy", "Handler": handler, "Prometheus": s.cfg.PrometheusURL != ""}
	if u, err := retryview.EndpointURL(src.Service(), retryview.PolicyPath, nil); err == nil {
		data["Source"] = "the service at " + s.mask(u)
	} else {
		data["Source"] = "the service at " + s.mask(src.Service())
	}
	if handler != "" {
		data["Title"] = "Retry policy of " + handler
	}
	ctx, cancel := s.ctx(r)
	defer cancel()
	pol, err := src.Policy(ctx)
	if err != nil {
		code, msg := s.sourceFailed(err)
		s.cfg.Logger.Warn("console: retry policy unavailable", "path", r.URL.Path, "error", msg)
		data["Error"] = msg
		s.render(w, r, code, "policy", data)
		return
	}
	data["Source"] = "the service at " + pol.URL
	var hs []HandlerPolicy
	for _, h := range pol.Handlers {
		if handler == "" || h.Name == handler {
			hs = append(hs, policySummary(h))
		}
	}
	if handler != "" && len(hs) == 0 {
		data["Error"] = fmt.Sprintf("the service at %s has no handler %q", pol.URL, handler)
		s.render(w, r, http.StatusNotFound, "policy", data)
		return
	}
	data["Handlers"], data["Breakers"], data["Notes"] = hs, pol.Breakers, pol.Notes
	s.render(w, r, http.StatusOK, "policy", data)
}

// apiPolicy serves GET /api/v1/policy: the decision matrix as `sluice policy --json`
// prints it (?handler=H: H only, 404 when the service has none).
func (s *Server) apiPolicy(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	pol, err := s.retrySource().Policy(ctx)
	if err != nil {
		code, msg := s.sourceFailed(err)
		s.writeJSON(w, code, apiError{Error: msg, Status: code})
		return
	}
	if h := r.URL.Query().Get("handler"); h != "" {
		d, ok := pol.Handler(h)
		if !ok {
			s.writeJSON(w, http.StatusNotFound, apiError{Error: fmt.Sprintf("the service at %s has no handler %q", pol.URL, h), Status: http.StatusNotFound})
			return
		}
		pol.Handlers = []policy.HandlerDescription{d}
	}
	s.writeJSON(w, http.StatusOK, pol)
}
