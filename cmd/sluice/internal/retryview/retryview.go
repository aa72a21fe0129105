// Package retryview reads what `sluice retries`, `sluice policy`, `sluice journal` and the
// console's retry and journal pages show: a running service's retry statistics, from
// Prometheus or from the service's own debug endpoint, its retry decision matrix, from the
// service, and its idempotency journal's figures, from Prometheus or the service's metrics
// (journal.go). The journal view lives here because it reads the same two sources.
//
// The CLI and the console read the same environment variables (PROMETHEUS_URL,
// SLUICE_SERVICE_URL) in cmd/sluice and hand them over as a Source, so both say the same
// thing about where the numbers came from.
package retryview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice/internal/mask"
	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/policy"
)

// DefaultServiceURL is SLUICE_SERVICE_URL's default: the metrics server of a service run
// with METRICS_ADDR=127.0.0.1:9464, as the README's examples and deploy/ do.
const DefaultServiceURL = "http://127.0.0.1:9464"

// The service's debug endpoints (telemetry/otelsetup.RetriesPath and PolicyPath).
const (
	RetriesPath = "/debug/sluice/retries"
	PolicyPath  = "/debug/sluice/policy"
)

// Prometheus metrics of the retry outcomes (telemetry/retryoutcome.go).
const (
	PromOutcomes = "sluice_retry_outcomes_total"
	PromRecovery = "sluice_retry_recovery_attempt_bucket"
)

// Timeout bounds one request to the service or to Prometheus when Source.Client is nil.
const Timeout = 15 * time.Second

// Where statistics were read, as Retries.Source and Policy.Source name it.
const (
	SourceService    = "service"
	SourcePrometheus = "prometheus"
)

// ErrNotHTTP means a configured URL is not an http(s) URL: a usage error, not an outage.
var ErrNotHTTP = errors.New("not an http(s) URL")

// sourceHint ends every error about reaching a source, so whoever reads it knows which
// setting to change.
const sourceHint = "The source is PROMETHEUS_URL when it is set, else SLUICE_SERVICE_URL (default " +
	DefaultServiceURL + ": the service's METRICS_ADDR)."

// Source says where to read: Prometheus when PrometheusURL is set, else the service.
type Source struct {
	// ServiceURL is the service's metrics server (SLUICE_SERVICE_URL): a URL, or a bare
	// host:port as METRICS_ADDR gives it. Empty means DefaultServiceURL.
	ServiceURL string
	// PrometheusURL (PROMETHEUS_URL), when set, is where Retries reads the statistics.
	// The decision matrix is the service's own and always comes from ServiceURL.
	PrometheusURL string
	// Client makes the requests. Nil means a client with Timeout.
	Client *http.Client
}

// Service returns ServiceURL, or DefaultServiceURL when it is empty.
func (s Source) Service() string {
	if u := strings.TrimSpace(s.ServiceURL); u != "" {
		return u
	}
	return DefaultServiceURL
}

// Describe says, in words with the password masked, where Retries reads: "Prometheus at
// http://…" or "the service at http://…/debug/sluice/retries".
func (s Source) Describe() string {
	if p := strings.TrimSpace(s.PrometheusURL); p != "" {
		return "Prometheus at " + mask.URL(p)
	}
	u, err := EndpointURL(s.Service(), RetriesPath, nil)
	if err != nil {
		return "the service at " + mask.URL(s.Service())
	}
	return "the service at " + mask.URL(u)
}

func (s Source) client() *http.Client {
	if s.Client != nil {
		return s.Client
	}
	return &http.Client{Transport: http.DefaultTransport, Timeout: Timeout}
}

// Retries is a retry statistics report and where it was read, as `sluice retries --json`
// prints it and the console's API serves it.
type Retries struct {
	// Source is SourceService or SourcePrometheus; URL is the address read, its password
	// masked.
	Source string `json:"source"`
	URL    string `json:"url"`
	retrystats.Report
}

// Describe says where r was read, as Source.Describe does.
func (r Retries) Describe() string {
	if r.Source == SourcePrometheus {
		return "Prometheus at " + r.URL
	}
	return "the service at " + r.URL
}

// Handlers returns the handlers r has rows of, sorted.
func (r Retries) Handlers() []string {
	var hs []string
	for _, t := range r.Types {
		if !slices.Contains(hs, t.Handler) {
			hs = append(hs, t.Handler)
		}
	}
	slices.Sort(hs)
	return hs
}

// Policy is a service's retry decision matrix and where it was read, as `sluice policy
// --json` prints it and the console's API serves it.
type Policy struct {
	Source string `json:"source"`
	URL    string `json:"url"`
	policy.Description
}

// Retries reads the retry statistics: from Prometheus, counted over the last window, when
// PrometheusURL is set; else from the service, over its own statistics' window (window is
// then unused). A non-empty handler keeps that handler's rows only. Types is never nil.
// Errors name the source, its password masked.
func (s Source) Retries(ctx context.Context, handler string, window time.Duration) (Retries, error) {
	var out Retries
	if prom := strings.TrimSpace(s.PrometheusURL); prom != "" {
		out.Source, out.URL = SourcePrometheus, mask.URL(prom)
		rep, err := s.promRetries(ctx, prom, handler, window)
		if err != nil {
			return out, maskErr(err, prom)
		}
		out.Report = rep
	} else {
		base := s.Service()
		u, err := EndpointURL(base, RetriesPath, url.Values{"handler": nonEmpty(handler)})
		if err != nil {
			return out, err
		}
		out.Source, out.URL = SourceService, mask.URL(u)
		if err := getJSON(ctx, s.client(), u, "the service", &out.Report); err != nil {
			return out, maskErr(err, base)
		}
		if handler != "" { // an older service may not filter
			out.Types = slices.DeleteFunc(out.Types, func(t retrystats.TypeReport) bool { return t.Handler != handler })
		}
	}
	if out.Types == nil {
		out.Types = []retrystats.TypeReport{}
	}
	return out, nil
}

// Policy reads the service's retry decision matrix. Handlers is never nil.
func (s Source) Policy(ctx context.Context) (Policy, error) {
	base := s.Service()
	u, err := EndpointURL(base, PolicyPath, nil)
	if err != nil {
		return Policy{}, err
	}
	out := Policy{Source: SourceService, URL: mask.URL(u)}
	if err := getJSON(ctx, s.client(), u, "the service", &out.Description); err != nil {
		return out, maskErr(err, base)
	}
	if out.Handlers == nil {
		out.Handlers = []policy.HandlerDescription{}
	}
	return out, nil
}

// Handler returns the description of the handler named name, and whether there is one.
func (p Policy) Handler(name string) (policy.HandlerDescription, bool) {
	for _, h := range p.Handlers {
		if h.Name == name {
			return h, true
		}
	}
	return policy.HandlerDescription{}, false
}

// promRetries reads the retry outcomes of the last window from Prometheus's HTTP API.
func (s Source) promRetries(ctx context.Context, base, handler string, window time.Duration) (retrystats.Report, error) {
	sel := ""
	if handler != "" {
		sel = fmt.Sprintf(`{handler=%s}`, strconv.Quote(handler))
	}
	rng := fmt.Sprintf("[%ds]", int64(window.Seconds()))
	r := retrystats.Report{Window: window.String(), WindowSeconds: window.Seconds()}
	outcomes, err := s.promQuery(ctx, base, fmt.Sprintf("sum by (handler, error_type, outcome) (increase(%s%s%s))", PromOutcomes, sel, rng))
	if err != nil {
		return r, err
	}
	buckets, err := s.promQuery(ctx, base, fmt.Sprintf("sum by (handler, error_type, le) (increase(%s%s%s))", PromRecovery, sel, rng))
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
	for _, smp := range outcomes {
		// increase() extrapolates: 2.9999 is three messages, and a series that did not
		// move in the window is no row at all.
		n := int64(math.Round(smp.value))
		if n == 0 {
			continue
		}
		t := row(smp.metric)
		switch smp.metric["outcome"] {
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
	for _, smp := range buckets {
		le, err := strconv.ParseFloat(smp.metric["le"], 64)
		if err != nil {
			continue
		}
		k := key{smp.metric["handler"], smp.metric["error_type"]}
		hist[k] = append(hist[k], bucket{le, smp.value})
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
func (s Source) promQuery(ctx context.Context, base, query string) ([]promSample, error) {
	u, err := EndpointURL(base, "/api/v1/query", url.Values{"query": {query}})
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
	if err := getJSON(ctx, s.client(), u, "Prometheus", &resp); err != nil {
		var he *HTTPError
		if !errors.As(err, &he) || !strings.Contains(he.Body, `"status"`) {
			return nil, err
		}
		_ = json.Unmarshal([]byte(he.Body), &resp) // Prometheus explains a refused query
	}
	if resp.Status != "success" {
		//nolint:staticcheck // ST1005: "Prometheus" is a name, capitalized wherever it stands
		return nil, fmt.Errorf("Prometheus at %s refused the query %s: %s: %s", mask.URL(base), query, resp.ErrorType, resp.Error)
	}
	if resp.Data.ResultType != "vector" {
		//nolint:staticcheck // ST1005: "Prometheus" is a name, capitalized wherever it stands
		return nil, fmt.Errorf("Prometheus at %s answered a %q for %s, want a vector", mask.URL(base), resp.Data.ResultType, query)
	}
	out := make([]promSample, 0, len(resp.Data.Result))
	for _, r := range resp.Data.Result {
		if len(r.Value) != 2 {
			continue
		}
		v, _ := r.Value[1].(string)
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) {
			continue
		}
		out = append(out, promSample{metric: r.Metric, value: f})
	}
	return out, nil
}

// EndpointURL joins base and path and adds query. A base without a scheme is taken for
// http, as METRICS_ADDR gives it. An error wraps ErrNotHTTP.
func EndpointURL(base, path string, query url.Values) (string, error) {
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("%s is %w", mask.URL(base), ErrNotHTTP)
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

// HTTPError is an answer other than 200 from the service or Prometheus.
type HTTPError struct {
	// URL is the address asked, its password masked.
	URL    string
	Status int
	Body   string
}

// Error says who answered what, with the service's {"error": …} message when it gave one.
func (e *HTTPError) Error() string {
	msg := strings.TrimSpace(e.Body)
	var je struct {
		Error string `json:"error"`
	}
	if json.Unmarshal([]byte(e.Body), &je) == nil && je.Error != "" {
		msg = je.Error
	}
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	return fmt.Sprintf("%s answered %d %s: %s", e.URL, e.Status, http.StatusText(e.Status), msg)
}

// getJSON reads u (of what: "the service" or "Prometheus") into v. A failure to reach it
// names the URL, masked, and the environment variables that choose it.
func getJSON(ctx context.Context, client *http.Client, u, what string, v any) error {
	body, err := get(ctx, client, u, what, "application/json")
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		hint := "is SLUICE_SERVICE_URL the service's METRICS_ADDR?"
		if what == "Prometheus" {
			hint = "is PROMETHEUS_URL Prometheus's address?"
		}
		return fmt.Errorf("%s at %s answered something other than the expected JSON (%v): %s", what, mask.URL(u), err, hint)
	}
	return nil
}

// get reads u (of what: "the service" or "Prometheus"), asking for accept, and returns its
// body (at most 32 MiB); an answer other than 200 is an *HTTPError. Errors name the URL
// masked, never with the password url.Error would repeat.
func get(ctx context.Context, client *http.Client, u, what, accept string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("request to %s at %s: %w", what, mask.URL(u), err)
	}
	req.Header.Set("Accept", accept)
	resp, err := client.Do(req)
	if err != nil {
		// url.Error repeats the URL, password and all: keep the cause only.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("cannot reach %s at %s: %v\n%s", what, mask.URL(u), err, sourceHint)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s's answer from %s: %w", what, mask.URL(u), err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &HTTPError{URL: mask.URL(u), Status: resp.StatusCode, Body: string(body)}
	}
	return body, nil
}

// maskErr hides raw's password in err's text, keeping err's chain for errors.Is and As.
func maskErr(err error, raw string) error {
	msg := mask.Text(err.Error(), raw)
	if msg == err.Error() {
		return err
	}
	return &maskedError{msg: msg, err: err}
}

type maskedError struct {
	msg string
	err error
}

func (e *maskedError) Error() string { return e.msg }
func (e *maskedError) Unwrap() error { return e.err }
