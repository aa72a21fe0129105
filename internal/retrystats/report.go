package retrystats

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Decisions of the learned retry policy about an error type, as Verdict.Decision.
const (
	// DecisionRetry: the type's retries recover often enough; it is retried.
	DecisionRetry = "retry"
	// DecisionStop: the type's retries do not recover; its messages are dead-lettered at
	// once (but the explored share, Verdict.Explore).
	DecisionStop = "stop"
	// DecisionNotEnoughEvidence: too few retried messages of the type ended in the window
	// to judge it; it is retried.
	DecisionNotEnoughEvidence = "not_enough_evidence"
	// DecisionNotJudged: the type is counted with others (OtherType); it is retried.
	DecisionNotJudged = "not_judged"
)

// Verdict is what the learned retry policy makes of one error type now.
type Verdict struct {
	// Decision is one of DecisionRetry, DecisionStop, DecisionNotEnoughEvidence and
	// DecisionNotJudged.
	Decision string `json:"decision"`
	// Exploring is true for a stopped type of which a share (Explore) still follows the
	// base policy, so that a dependency that heals shows in their recoveries.
	Exploring bool `json:"exploring,omitempty"`
	// Explore is the share of a stopped type's messages still retried.
	Explore float64 `json:"explore,omitempty"`
	// Probe is the id of the message a stopped type's probe lease waits for in this
	// process (the explored message in its retry path), "" when none: then the type's
	// next message is explored as the probe.
	Probe string `json:"probe,omitempty"`
	// ShortenTo is the attempt the learned policy's Shorten cuts a retried type's schedule
	// to, 0 when it does not.
	ShortenTo int `json:"shorten_to,omitempty"`
	// Evidence is the policy's evidence in words ("0 of 312 recovered in the last hour").
	Evidence string `json:"evidence,omitempty"`
	// Reason says why, or why not, in a sentence.
	Reason string `json:"reason"`
}

// Judge returns the learned policy's verdict on one handler's error type, given its
// counts. A nil Judge means no learned policy.
type Judge func(t TypeStats) Verdict

// LearnedSettings are the learned policy's settings, as a Report shows them.
type LearnedSettings struct {
	// MinEvidence is how many retried messages of a type must have ended in the window
	// before the policy judges it.
	MinEvidence int64 `json:"min_evidence"`
	// UnlikelyBelow is the recovery rate below which retrying stops.
	UnlikelyBelow float64 `json:"unlikely_below"`
	// Explore is the share of a stopped type's messages still retried.
	Explore float64 `json:"explore"`
	// Shorten is true when the policy cuts a retried type's schedule to the attempt by
	// which 99% of its recoveries came.
	Shorten bool `json:"shorten,omitempty"`
}

// Report is the retry statistics of a process, per handler and error type, as the
// service's endpoint (GET /debug/sluice/retries) serves them in JSON.
type Report struct {
	// Window is the time the counts cover (a Go duration, "1h0m0s").
	Window string `json:"window"`
	// WindowSeconds is Window in seconds.
	WindowSeconds float64 `json:"window_seconds"`
	// Learned is the learned retry policy's settings; nil without one.
	Learned *LearnedSettings `json:"learned"`
	// Types are the counts, by handler then error type.
	Types []TypeReport `json:"types"`
}

// TypeReport is the counts of one handler's error type over the window.
type TypeReport struct {
	Handler   string `json:"handler"`
	ErrorType string `json:"error_type"`
	// Failed is how many messages failed with the type.
	Failed int64 `json:"failed"`
	// Retries is how many retries were spent on it; InFlight how many of them have not
	// come back yet.
	Retries  int64 `json:"retries"`
	InFlight int64 `json:"in_flight"`
	// How the messages ended, under the type of their last failure.
	Recovered     int64 `json:"recovered"`
	Exhausted     int64 `json:"exhausted"`
	Permanent     int64 `json:"permanent"`
	Discarded     int64 `json:"discarded"`
	DeadLettered  int64 `json:"dead_lettered"`
	RetryUnlikely int64 `json:"retry_unlikely"`
	// Ended is the sum of the ends above.
	Ended int64 `json:"ended"`
	// RecoveredPct is Recovered over Ended, in percent; nil when none ended.
	RecoveredPct *float64 `json:"recovered_pct"`
	// MedianRecoveryAttempt is the attempt by which half the recovered messages had
	// recovered; 0 when none recovered.
	MedianRecoveryAttempt int `json:"median_recovery_attempt"`
	// RecoveredAt counts the recoveries by attempt ("2", "3", …; the last bin,
	// AttemptBins+1, counts that attempt and later ones).
	RecoveredAt map[string]int64 `json:"recovered_at,omitempty"`
	// Learned is the learned policy's verdict on the type now; nil without one.
	Learned *Verdict `json:"learned,omitempty"`
}

// Finish computes Ended and RecoveredPct from the counts.
func (t *TypeReport) Finish() {
	t.Ended = t.Recovered + t.Exhausted + t.Permanent + t.Discarded + t.DeadLettered + t.RetryUnlikely
	t.RecoveredPct = nil
	if t.Ended > 0 {
		pct := 100 * float64(t.Recovered) / float64(t.Ended)
		t.RecoveredPct = &pct
	}
}

// ReportOf returns t as a report row, with judge's verdict (nil: none).
func ReportOf(t TypeStats, judge Judge) TypeReport {
	r := TypeReport{
		Handler: t.Handler, ErrorType: t.ErrorType, Failed: t.Messages, Retries: t.Retries, InFlight: t.InFlight,
		Recovered: t.Recovered, Exhausted: t.Exhausted, Permanent: t.Permanent, Discarded: t.Discarded,
		DeadLettered: t.DeadLettered, RetryUnlikely: t.Unlikely, MedianRecoveryAttempt: t.RecoveryAttempt(0.5),
	}
	for i, n := range t.RecoveredAt {
		if n == 0 {
			continue
		}
		if r.RecoveredAt == nil {
			r.RecoveredAt = map[string]int64{}
		}
		r.RecoveredAt[strconv.Itoa(i+2)] = n
	}
	r.Finish()
	if judge != nil {
		v := judge(t)
		r.Learned = &v
	}
	return r
}

// Report returns the counts of every tracked type over the window, by handler then error
// type, each with judge's verdict (nil: no learned policy; Report.Learned is then nil, and
// the caller that has one fills it in).
func (s *Stats) Report(judge Judge) Report {
	snap := s.Snapshot()
	r := Report{Window: s.cfg.Window.String(), WindowSeconds: s.cfg.Window.Seconds(), Types: make([]TypeReport, 0, len(snap))}
	for _, t := range snap {
		r.Types = append(r.Types, ReportOf(t, judge))
	}
	return r
}

// Handler serves the Stats' Report, without a learned policy's verdicts; see
// ReportHandler.
func (s *Stats) Handler() http.Handler {
	return ReportHandler(func() Report { return s.Report(nil) })
}

// ReportHandler serves report() as JSON on GET (and HEAD); ?handler=H keeps H's rows
// only.
func ReportHandler(report func() Report) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		r := report()
		if h := req.URL.Query().Get("handler"); h != "" {
			kept := r.Types[:0:0]
			for _, t := range r.Types {
				if t.Handler == h {
					kept = append(kept, t)
				}
			}
			r.Types = kept
		}
		writeJSON(w, r)
	})
}

// writeJSON writes v as indented JSON with status 200.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// WindowDuration returns the report's window as a duration.
func (r Report) WindowDuration() time.Duration {
	return time.Duration(r.WindowSeconds * float64(time.Second))
}

// Text is the verdict's decision in words.
func (v Verdict) Text() string {
	switch v.Decision {
	case DecisionRetry:
		return "retry"
	case DecisionStop:
		if v.Exploring {
			return fmt.Sprintf("stop retrying (exploring %g%%)", v.Explore*100)
		}
		return "stop retrying"
	case DecisionNotEnoughEvidence:
		return "retry (not enough evidence)"
	case DecisionNotJudged:
		return "retry (not judged)"
	}
	return v.Decision
}
