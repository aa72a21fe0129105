package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/internal/stackview"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// fakeService serves a real stack's debug endpoints, as the service's metrics server
// does: handler "pay" on queue cli.pay, with a learned policy (10 messages of evidence) and
// statistics holding "timeout" (3 recovered at attempts 2, 2, 3; 1 exhausted), "declined"
// (2 permanent) and, on handler "ship", "down" (12 exhausted: retries stopped); "pay"
// compensates to queue cli.pay.failed.
func fakeService(t *testing.T) string {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := memory.New(memory.Config{Logger: logger})
	t.Cleanup(func() { _ = b.Close() })
	stats, err := retrystats.New(retrystats.Config{})
	require.NoError(t, err)
	s, err := router.New(b, router.Config{Logger: logger, CloseTimeout: 50 * time.Millisecond,
		Retry: retry.Config{MaxRetries: 3, InitialDelay: 100 * time.Millisecond, MaxDelay: 400 * time.Millisecond, Jitter: retry.NoJitter,
			Stats: stats, Learned: &retry.Learned{MinEvidence: 10}}})
	require.NoError(t, err)
	nop := func(*message.Message) error { return nil }
	require.NoError(t, s.Handle("pay", "cli.pay", nop, router.WithCompensation(router.Compensation{Queue: "cli.pay.failed",
		Build: func(msg, _ *message.Message) (*message.Message, error) {
			return message.NewMessage("", msg.Payload), nil
		}})))
	require.NoError(t, s.Handle("ship", "cli.ship", nop))
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-ran
		_ = s.Close()
	})
	<-s.Running()
	rec := func(h string, ev retrystats.RetryEvent) { stats.Record(h, ev) }
	for _, at := range []int{2, 2, 3, 0} {
		rec("pay", retrystats.RetryEvent{ErrorType: "timeout", NewMessage: true, Retried: true, Attempt: 1})
		for a := 2; a < at; a++ {
			rec("pay", retrystats.RetryEvent{ErrorType: "timeout", Resolved: "timeout", Retried: true, Attempt: a})
		}
		if at == 0 {
			rec("pay", retrystats.RetryEvent{ErrorType: "timeout", Resolved: "timeout", End: retrystats.Exhausted, Attempt: 4})
			continue
		}
		rec("pay", retrystats.RetryEvent{ErrorType: "timeout", Resolved: "timeout", End: retrystats.Recovered, Attempt: at})
	}
	for range 2 {
		rec("pay", retrystats.RetryEvent{ErrorType: "declined", NewMessage: true, End: retrystats.MadePermanent, Attempt: 1})
	}
	for range 12 {
		rec("ship", retrystats.RetryEvent{ErrorType: "down", NewMessage: true, Retried: true, Attempt: 1})
		rec("ship", retrystats.RetryEvent{ErrorType: "down", Resolved: "down", End: retrystats.Exhausted, Attempt: 4})
	}
	view, _ := stackview.Of(s)
	mux := http.NewServeMux()
	mux.Handle(retriesPath, view.Retries)
	mux.Handle(policyPath, view.Policy)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// fakePrometheus answers /api/v1/query as Prometheus does, from the series it holds, and
// records the queries.
type fakePrometheus struct {
	srv     *httptest.Server
	mu      sync.Mutex
	queries []string
	fail    string // a query refused when it contains this
}

func newFakePrometheus(t *testing.T) *fakePrometheus {
	t.Helper()
	f := &fakePrometheus{}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakePrometheus) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/query" {
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query().Get("query")
	f.mu.Lock()
	f.queries = append(f.queries, q)
	fail := f.fail
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if fail != "" && strings.Contains(q, fail) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"status":"error","errorType":"bad_data","error":"parse error at char 3"}`)
		return
	}
	type sample struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	}
	s := func(v string, labels ...string) sample {
		m := map[string]string{}
		for i := 0; i+1 < len(labels); i += 2 {
			m[labels[i]] = labels[i+1]
		}
		return sample{Metric: m, Value: [2]any{1.7e9, v}}
	}
	var result []sample
	switch {
	case strings.Contains(q, promOutcomes):
		// increase() extrapolates: counts come back as floats.
		result = []sample{
			s("4.0000001", "handler", "pay", "error_type", "timeout", "outcome", "failed"),
			s("5", "handler", "pay", "error_type", "timeout", "outcome", "retried"),
			s("2.9999", "handler", "pay", "error_type", "timeout", "outcome", "recovered"),
			s("1", "handler", "pay", "error_type", "timeout", "outcome", "exhausted"),
			s("2", "handler", "pay", "error_type", "declined", "outcome", "failed"),
			s("2", "handler", "pay", "error_type", "declined", "outcome", "permanent"),
			s("0", "handler", "pay", "error_type", "idle", "outcome", "failed"),
			s("7", "handler", "ship", "error_type", "down", "outcome", "retry_unlikely"),
		}
	case strings.Contains(q, promRecovery):
		for le, n := range map[string]string{"2": "2", "3": "3", "4": "3", "+Inf": "3"} {
			result = append(result, s(n, "handler", "pay", "error_type", "timeout", "le", le))
		}
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{"resultType": "vector", "result": result}})
}

func (f *fakePrometheus) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.queries...)
}

func TestRetries_FromTheService(t *testing.T) {
	base := fakeService(t)
	u, err := url.Parse(base)
	require.NoError(t, err)
	withSecret := "http://ops:s3cr3tpw@" + u.Host
	tests := []struct {
		name  string
		env   map[string]string
		args  []string
		check func(t *testing.T, stdout string)
	}{
		{name: "table", env: map[string]string{"SLUICE_SERVICE_URL": base}, check: func(t *testing.T, out string) {
			assert.Contains(t, out, "Retry statistics from the service at "+base+retriesPath+", over the last 1h.")
			assert.Contains(t, out, "Learned retry policy: stops an error type below 1% recovered, after 10 ended messages; explores 5%.")
			assert.Regexp(t, `HANDLER\s+ERROR TYPE\s+FAILED\s+RETRIES\s+RECOVERED\s+RECOVERED %\s+MEDIAN ATTEMPT\s+EXHAUSTED\s+PERMANENT\s+RETRY_UNLIKELY\s+OTHER ENDS\s+LEARNED POLICY`, out)
			assert.Regexp(t, `pay\s+timeout\s+4\s+5\s+3\s+75\.0%\s+2\s+1\s+0\s+0\s+0\s+retry \(not enough evidence\)`, out)
			assert.Regexp(t, `pay\s+declined\s+2\s+0\s+0\s+0\.0%\s+-\s+0\s+2\s+0\s+0\s+retry \(not enough evidence\)`, out)
			assert.Regexp(t, `ship\s+down\s+12\s+12\s+0\s+0\.0%\s+-\s+12\s+0\s+0\s+0\s+stop retrying \(exploring 5%\): 0 of 12 recovered in the last hour`, out)
		}},
		{name: "one handler", env: map[string]string{"SLUICE_SERVICE_URL": base}, args: []string{"--handler", "ship"}, check: func(t *testing.T, out string) {
			assert.Contains(t, out, "ship  ")
			assert.NotContains(t, out, "timeout")
		}},
		{name: "a handler without failures", env: map[string]string{"SLUICE_SERVICE_URL": base}, args: []string{"--handler", "nobody"}, check: func(t *testing.T, out string) {
			assert.Contains(t, out, `No failures of handler "nobody" in the window.`)
		}},
		{name: "JSON", env: map[string]string{"SLUICE_SERVICE_URL": withSecret}, args: []string{"--json"}, check: func(t *testing.T, out string) {
			var r retriesReport
			require.NoError(t, json.Unmarshal([]byte(out), &r))
			assert.Equal(t, sourceService, r.Source)
			assert.Equal(t, "http://ops:xxxxx@"+u.Host+retriesPath, r.URL)
			require.Len(t, r.Types, 3)
			tm := r.Types[1]
			assert.Equal(t, [2]string{"pay", "timeout"}, [2]string{tm.Handler, tm.ErrorType})
			assert.Equal(t, []int64{4, 5, 3, 1, 4}, []int64{tm.Failed, tm.Retries, tm.Recovered, tm.Exhausted, tm.Ended})
			assert.Equal(t, 2, tm.MedianRecoveryAttempt)
			assert.Equal(t, map[string]int64{"2": 2, "3": 1}, tm.RecoveredAt)
			require.NotNil(t, r.Types[2].Learned)
			assert.Equal(t, retrystats.DecisionStop, r.Types[2].Learned.Decision)
			assert.Equal(t, int64(10), r.Learned.MinEvidence)
		}},
		{name: "a bare METRICS_ADDR", env: map[string]string{"SLUICE_SERVICE_URL": u.Host}, args: []string{"--json"}, check: func(t *testing.T, out string) {
			assert.Contains(t, out, `"source": "service"`)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runTraceCLI(tc.env, append([]string{"retries"}, tc.args...)...)
			require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			tc.check(t, stdout)
			assert.NotContains(t, stdout+stderr, "s3cr3tpw")
		})
	}
}

func TestRetries_FromPrometheus(t *testing.T) {
	prom := newFakePrometheus(t)
	withSecret := strings.Replace(prom.srv.URL, "http://", "http://ops:s3cr3tpw@", 1)
	env := map[string]string{"PROMETHEUS_URL": withSecret, "SLUICE_SERVICE_URL": "http://127.0.0.1:1"}

	code, stdout, stderr := runTraceCLI(env, "retries", "--json", "--window", "30m", "--handler", "pay")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	var r retriesReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &r))
	assert.Equal(t, sourcePrometheus, r.Source)
	assert.Equal(t, strings.Replace(prom.srv.URL, "http://", "http://ops:xxxxx@", 1), r.URL)
	assert.Equal(t, 1800.0, r.WindowSeconds)
	assert.Nil(t, r.Learned, "Prometheus does not know the learned policy's settings")
	want := []retrystats.TypeReport{
		{Handler: "pay", ErrorType: "declined", Failed: 2, Permanent: 2, Ended: 2, RecoveredPct: ptr(0.0)},
		{Handler: "pay", ErrorType: "timeout", Failed: 4, Retries: 5, Recovered: 3, Exhausted: 1, Ended: 4, RecoveredPct: ptr(75.0), MedianRecoveryAttempt: 2},
		{Handler: "ship", ErrorType: "down", RetryUnlikely: 7, Ended: 7, RecoveredPct: ptr(0.0)},
	}
	assert.Equal(t, want, r.Types, "rounded counts; a zero series left out; the median from the buckets")
	queries := prom.seen()
	require.Len(t, queries, 2)
	assert.Equal(t, `sum by (handler, error_type, outcome) (increase(sluice_retry_outcomes_total{handler="pay"}[1800s]))`, queries[0])
	assert.Equal(t, `sum by (handler, error_type, le) (increase(sluice_retry_recovery_attempt_bucket{handler="pay"}[1800s]))`, queries[1])

	code, stdout, stderr = runTraceCLI(env, "retries")
	require.Equal(t, exitOK, code, "stderr:\n%s", stderr)
	assert.Contains(t, stdout, "Retry statistics from Prometheus at http://ops:xxxxx@")
	assert.Regexp(t, `ship\s+down\s+0\s+0\s+0\s+0\.0%\s+-\s+0\s+0\s+7\s+0\n`, stdout)
	assert.NotContains(t, stdout, "LEARNED POLICY")
	assert.NotContains(t, stdout+stderr, "s3cr3tpw")
	assert.Equal(t, `sum by (handler, error_type, outcome) (increase(sluice_retry_outcomes_total[3600s]))`, prom.seen()[2])
}

func ptr[T any](v T) *T { return &v }

func TestRetries_Failures(t *testing.T) {
	prom := newFakePrometheus(t)
	prom.fail = promRecovery
	noStats := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"error":"no retry statistics: the stack keeps them with router.Config.Retry.Stats"}`)
	}))
	t.Cleanup(noStats.Close)
	notJSON := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "hello") }))
	t.Cleanup(notJSON.Close)
	tests := []struct {
		name       string
		env        map[string]string
		args       []string
		wantCode   int
		wantStderr []string
	}{
		{name: "service unreachable", env: map[string]string{"SLUICE_SERVICE_URL": "http://ops:s3cr3tpw@127.0.0.1:1"}, wantCode: exitFailed,
			wantStderr: []string{"cannot reach the service at http://ops:xxxxx@127.0.0.1:1" + retriesPath, "PROMETHEUS_URL", "SLUICE_SERVICE_URL"}},
		{name: "default service URL", env: nil, wantCode: exitFailed,
			wantStderr: []string{"at " + defaultServiceURL + retriesPath}},
		{name: "Prometheus unreachable", env: map[string]string{"PROMETHEUS_URL": "http://ops:s3cr3tpw@127.0.0.1:1"}, wantCode: exitFailed,
			wantStderr: []string{"cannot reach Prometheus at http://ops:xxxxx@127.0.0.1:1/api/v1/query", "PROMETHEUS_URL", "SLUICE_SERVICE_URL"}},
		{name: "Prometheus refuses the query", env: map[string]string{"PROMETHEUS_URL": prom.srv.URL}, wantCode: exitFailed,
			wantStderr: []string{"refused the query", "bad_data: parse error at char 3"}},
		{name: "a service without statistics", env: map[string]string{"SLUICE_SERVICE_URL": noStats.URL}, wantCode: exitFailed,
			wantStderr: []string{"answered 404 Not Found: no retry statistics"}},
		{name: "not a sluice service", env: map[string]string{"SLUICE_SERVICE_URL": notJSON.URL}, wantCode: exitFailed,
			wantStderr: []string{"answered something other than the expected JSON", "METRICS_ADDR"}},
		{name: "not an http URL", env: map[string]string{"SLUICE_SERVICE_URL": "ftp://x"}, wantCode: exitUsage,
			wantStderr: []string{"ftp://x is not an http(s) URL"}},
		{name: "an argument", args: []string{"extra"}, wantCode: exitUsage, wantStderr: []string{`unexpected arguments ["extra"]`}},
		{name: "a short window", args: []string{"--window", "10ms"}, wantCode: exitUsage, wantStderr: []string{"--window must be at least 1s"}},
		{name: "help", args: []string{"-h"}, wantCode: exitOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runTraceCLI(tc.env, append([]string{"retries"}, tc.args...)...)
			assert.Equal(t, tc.wantCode, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			for _, w := range tc.wantStderr {
				assert.Contains(t, stderr, w)
			}
			assert.NotContains(t, stdout+stderr, "s3cr3tpw")
		})
	}
}

func TestRetriesAndPolicy_AreListed(t *testing.T) {
	code, stdout, _ := runTraceCLI(nil, "help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stdout, "retries  show retry statistics")
	assert.Contains(t, stdout, "policy   show the running service's retry decision matrix")
	code, stdout, _ = runTraceCLI(nil, "retries", "-h")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stdout, "Usage: sluice retries [--handler H] [--json] [--window D]")
}
