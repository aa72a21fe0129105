package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-go/sluice/internal/mask"
	"github.com/sluice-go/sluice/retrystats"
	"github.com/sluice-go/sluice/router"
)

// defaultServiceURL is SLUICE_SERVICE_URL's default: the metrics server of a service run
// with METRICS_ADDR=127.0.0.1:9464, as the README's examples and deploy/ do.
const defaultServiceURL = "http://127.0.0.1:9464"

// The service's debug endpoints (telemetry/otelsetup.RetriesPath and PolicyPath).
const (
	retriesPath = "/debug/sluice/retries"
	policyPath  = "/debug/sluice/policy"
)

// Prometheus metrics of the retry outcomes (telemetry/retryoutcome.go).
const (
	promOutcomes = "sluice_retry_outcomes_total"
	promRecovery = "sluice_retry_recovery_attempt_bucket"
)

// serviceTimeout bounds a request to the service or to Prometheus.
const serviceTimeout = 15 * time.Second

// Sources a command read, as its output names them.
const (
	sourceService    = "service"
	sourcePrometheus = "prometheus"
)

const retriesAbout = `Prints, per handler and error type, how the messages that failed ended over
the statistics' window: messages failed, retries spent, recovered (count, share of
those that ended, median recovery attempt), exhausted, permanent, retry_unlikely,
and what the learned retry policy makes of the type now, when the service has one.

Source: Prometheus when PROMETHEUS_URL is set (` + promOutcomes + ` and
sluice_retry_recovery_attempt over --window), else the running service's endpoint
SLUICE_SERVICE_URL` + retriesPath + ` (SLUICE_SERVICE_URL defaults to ` + defaultServiceURL + `:
the service's METRICS_ADDR). The output says which it read.`

// retriesReport is what sluice retries prints with --json.
type retriesReport struct {
	// Source is "service" or "prometheus"; URL is the address read, its password masked.
	Source string `json:"source"`
	URL    string `json:"url"`
	retrystats.Report
}

func runRetries(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("sluice retries", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	handler := fs.String("handler", "", "show handler `H` only")
	asJSON := fs.Bool("json", false, "print JSON")
	window := fs.Duration("window", time.Hour, "with PROMETHEUS_URL: count over the last `D`")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: sluice retries [--handler H] [--json] [--window D]\n\n%s\n\nFlags:\n", retriesAbout)
		printFlags(w, fs, nil)
		fmt.Fprintln(w, "\nExit codes: 0 ok, 1 service or Prometheus unreachable or failing, 2 usage error.")
	}
	pos, err := parseInterleaved(e, fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usageErrorf("sluice retries: unexpected arguments %q (see 'sluice retries -h')", pos)
	case *window < time.Second:
		return usageErrorf("sluice retries: --window must be at least 1s, got %s", *window)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*serviceTimeout)
	defer cancel()
	client := newHTTPClient()
	defer client.CloseIdleConnections()

	var out retriesReport
	if prom := strings.TrimSpace(e.getenv("PROMETHEUS_URL")); prom != "" {
		out.Source, out.URL = sourcePrometheus, mask.URL(prom)
		out.Report, err = promRetries(ctx, client, prom, *handler, *window)
		if err != nil {
			return redactErr(err, prom)
		}
	} else {
		base := serviceURL(e)
		u, err := endpointURL(base, retriesPath, url.Values{"handler": nonEmpty(*handler)})
		if err != nil {
			return err
		}
		out.Source, out.URL = sourceService, mask.URL(u)
		if err := getJSON(ctx, client, u, &out.Report); err != nil {
			return redactErr(err, base)
		}
		if *handler != "" { // an older service may not filter
			out.Types = slices.DeleteFunc(out.Types, func(t retrystats.TypeReport) bool { return t.Handler != *handler })
		}
	}
	if out.Types == nil {
		out.Types = []retrystats.TypeReport{}
	}
	if *asJSON {
		return writeJSON(e, out)
	}
	return printRetries(e.stdout, out, *handler)
}

// printRetries writes r as a table.
func printRetries(w io.Writer, r retriesReport, handler string) error {
	what := "the service at " + r.URL
	if r.Source == sourcePrometheus {
		what = "Prometheus at " + r.URL
	}
	fmt.Fprintf(w, "Retry statistics from %s, over the last %s.\n", what, router.Duration(r.WindowDuration()))
	if l := r.Learned; l != nil {
		fmt.Fprintf(w, "Learned retry policy: stops an error type below %g%% recovered, after %d ended messages; explores %g%%.\n",
			l.UnlikelyBelow*100, l.MinEvidence, l.Explore*100)
	}
	fmt.Fprintln(w)
	if len(r.Types) == 0 {
		if handler != "" {
			fmt.Fprintf(w, "No failures of handler %q in the window.\n", handler)
		} else {
			fmt.Fprintln(w, "No failures in the window.")
		}
		return nil
	}
	learned := r.Learned != nil
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "HANDLER\tERROR TYPE\tFAILED\tRETRIES\tRECOVERED\tRECOVERED %\tMEDIAN ATTEMPT\tEXHAUSTED\tPERMANENT\tRETRY_UNLIKELY\tOTHER ENDS"
	if learned {
		head += "\tLEARNED POLICY"
	}
	fmt.Fprintln(tw, head)
	for _, t := range r.Types {
		pct, median := "-", "-"
		if t.RecoveredPct != nil {
			pct = strconv.FormatFloat(*t.RecoveredPct, 'f', 1, 64) + "%"
		}
		if t.MedianRecoveryAttempt > 0 {
			median = strconv.Itoa(t.MedianRecoveryAttempt)
		}
		line := fmt.Sprintf("%s\t%s\t%d\t%d\t%d\t%s\t%s\t%d\t%d\t%d\t%d", t.Handler, t.ErrorType, t.Failed, t.Retries, t.Recovered, pct, median,
			t.Exhausted, t.Permanent, t.RetryUnlikely, t.Discarded+t.DeadLettered)
		if learned {
			policy := "-"
			if t.Learned != nil {
				policy = router.DecisionText(*t.Learned)
				if t.Learned.Evidence != "" {
					policy += ": " + t.Learned.Evidence
				}
			}
			line += "\t" + policy
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nRECOVERED % is of the messages that ended; OTHER ENDS are discarded or dead-lettered by other steps.")
	return nil
}

// promRetries reads the retry outcomes of the last window from Prometheus's HTTP API.
func promRetries(ctx context.Context, client *http.Client, base, handler string, window time.Duration) (retrystats.Report, error) {
	sel := ""
	if handler != "" {
		sel = fmt.Sprintf(`{handler=%s}`, strconv.Quote(handler))
	}
	rng := fmt.Sprintf("[%ds]", int64(window.Seconds()))
	r := retrystats.Report{Window: window.String(), WindowSeconds: window.Seconds()}
	outcomes, err := promQuery(ctx, client, base, fmt.Sprintf("sum by (handler, error_type, outcome) (increase(%s%s%s))", promOutcomes, sel, rng))
	if err != nil {
		return r, err
	}
	buckets, err := promQuery(ctx, client, base, fmt.Sprintf("sum by (handler, error_type, le) (increase(%s%s%s))", promRecovery, sel, rng))
	if err != nil {
		return r, err
	}
	type key struct{ handler, errType string }
	rows := map[key]*retrystats.TypeReport{}
	row := func(m map[string]string) *retrystats.TypeReport {
		k := key{m["handler"], m["error_type"]}
		if rows[k] == nil {
			rows[k] = &retrystats.TypeReport{Handler: k.handler, ErrorType: k.errType}
		}
		return rows[k]
	}
	for _, s := range outcomes {
		n := int64(math.Round(s.value))
		if n == 0 {
			continue
		}
		t := row(s.metric)
		switch s.metric["outcome"] {
		case "failed":
			t.Failed += n
		case "retried":
			t.Retries += n
		case "recovered":
			t.Recovered += n
		case "exhausted":
			t.Exhausted += n
		case "permanent":
			t.Permanent += n
		case "discarded":
			t.Discarded += n
		case "dead_lettered":
			t.DeadLettered += n
		case "retry_unlikely":
			t.RetryUnlikely += n
		}
	}
	type bucket struct {
		le    float64
		count float64
	}
	hist := map[key][]bucket{}
	for _, s := range buckets {
		le, err := strconv.ParseFloat(s.metric["le"], 64)
		if err != nil {
			continue
		}
		k := key{s.metric["handler"], s.metric["error_type"]}
		hist[k] = append(hist[k], bucket{le, s.value})
	}
	for k, bs := range hist {
		t := rows[k]
		if t == nil {
			continue
		}
		sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
		total := bs[len(bs)-1].count
		if total < 0.5 {
			continue
		}
		for i, b := range bs {
			if b.count >= total/2 {
				if math.IsInf(b.le, 1) {
					if i > 0 {
						t.MedianRecoveryAttempt = int(bs[i-1].le) + 1
					}
				} else {
					t.MedianRecoveryAttempt = int(math.Ceil(b.le))
				}
				break
			}
		}
	}
	for _, t := range rows {
		t.Finish()
		r.Types = append(r.Types, *t)
	}
	sort.Slice(r.Types, func(i, j int) bool {
		if r.Types[i].Handler != r.Types[j].Handler {
			return r.Types[i].Handler < r.Types[j].Handler
		}
		return r.Types[i].ErrorType < r.Types[j].ErrorType
	})
	return r, nil
}

// promSample is one sample of an instant vector.
type promSample struct {
	metric map[string]string
	value  float64
}

// promQuery runs an instant query over Prometheus's HTTP API (/api/v1/query).
func promQuery(ctx context.Context, client *http.Client, base, query string) ([]promSample, error) {
	u, err := endpointURL(base, "/api/v1/query", url.Values{"query": {query}})
	if err != nil {
		return nil, err
	}
	var resp struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
		Data      struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  []any             `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := getJSONFrom(ctx, client, u, "Prometheus", &resp); err != nil {
		var he *httpError
		if !errors.As(err, &he) || !strings.Contains(he.body, `"status"`) {
			return nil, err
		}
		_ = json.Unmarshal([]byte(he.body), &resp) // Prometheus explains a refused query
	}
	if resp.Status != "success" {
		return nil, fmt.Errorf("sluice retries: Prometheus at %s refused the query %s: %s: %s", mask.URL(base), query, resp.ErrorType, resp.Error)
	}
	if resp.Data.ResultType != "vector" {
		return nil, fmt.Errorf("sluice retries: Prometheus at %s answered a %q for %s, want a vector", mask.URL(base), resp.Data.ResultType, query)
	}
	out := make([]promSample, 0, len(resp.Data.Result))
	for _, r := range resp.Data.Result {
		if len(r.Value) != 2 {
			continue
		}
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(v) {
			continue
		}
		out = append(out, promSample{metric: r.Metric, value: v})
	}
	return out, nil
}

// serviceURL is SLUICE_SERVICE_URL, else defaultServiceURL.
func serviceURL(e *env) string {
	if u := strings.TrimSpace(e.getenv("SLUICE_SERVICE_URL")); u != "" {
		return u
	}
	return defaultServiceURL
}

// endpointURL joins base and path and adds query.
func endpointURL(base, path string, query url.Values) (string, error) {
	if !strings.Contains(base, "://") {
		base = "http://" + base // a METRICS_ADDR given as it is
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", usageErrorf("sluice: %s is not an http(s) URL", mask.URL(base))
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	q := u.Query()
	for k, vs := range query {
		for _, v := range vs {
			q.Add(k, v)
		}
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

func newHTTPClient() *http.Client {
	return &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: serviceTimeout}
}

// httpError is an answer other than 200.
type httpError struct {
	url    string
	status int
	body   string
}

func (e *httpError) Error() string {
	msg := strings.TrimSpace(e.body)
	var je struct {
		Error string `json:"error"`
	}
	if json.Unmarshal([]byte(e.body), &je) == nil && je.Error != "" {
		msg = je.Error
	}
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	return fmt.Sprintf("%s answered %d %s: %s", e.url, e.status, http.StatusText(e.status), msg)
}

// getJSON reads the service's endpoint u into v.
func getJSON(ctx context.Context, client *http.Client, u string, v any) error {
	return getJSONFrom(ctx, client, u, "the service", v)
}

// getJSONFrom reads u (of what: "the service" or "Prometheus") into v. A failure to reach
// it names the URL, masked, and the environment variables that choose it.
func getJSONFrom(ctx context.Context, client *http.Client, u, what string, v any) error {
	body, err := get(ctx, client, u, what, "application/json")
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		hint := "is SLUICE_SERVICE_URL the service's METRICS_ADDR?"
		if what == "Prometheus" {
			hint = "is PROMETHEUS_URL Prometheus's address?"
		}
		return fmt.Errorf("sluice: %s at %s answered something other than the expected JSON (%v): %s", what, mask.URL(u), err, hint)
	}
	return nil
}

// get reads u, accepting accept.
func get(ctx context.Context, client *http.Client, u, what, accept string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("sluice: cannot reach %s at %s: %v\n"+
			"The source is PROMETHEUS_URL when it is set, else SLUICE_SERVICE_URL (default %s: the service's METRICS_ADDR).",
			what, mask.URL(u), err, defaultServiceURL)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return nil, fmt.Errorf("sluice: read %s's answer from %s: %w", what, mask.URL(u), err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("sluice: %w", &httpError{url: mask.URL(u), status: resp.StatusCode, body: string(body)})
	}
	return body, nil
}
