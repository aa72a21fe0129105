package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/internal/retryview"
	"github.com/sluice-go/sluice/policy"
	"github.com/sluice-go/sluice/telemetry"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

// fakeJournalService serves, as a service's metrics server does, state's journal metrics
// through the real exporter (so the names are the ones sluice journal must read) and a
// description in which handler "pay" journals on journal (none when journal is empty).
func fakeJournalService(t *testing.T, state telemetry.JournalState, journal string) string {
	t.Helper()
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	providers, err := otelsetup.Setup(ctx, otelsetup.Config{ServiceName: "journal-cli"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = providers.Shutdown(context.Background()) })
	inst, err := providers.Instrumentation()
	require.NoError(t, err)
	reg, err := inst.RegisterJournal(func() telemetry.JournalState { return state })
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Unregister() })
	desc := policy.Description{Handlers: []policy.HandlerDescription{{Name: "pay", Queue: "cli.pay", Idempotency: &policy.IdempotencyDescription{Journal: journal}}}}
	mux := http.NewServeMux()
	mux.Handle(retryview.MetricsPath, providers.MetricsHandler())
	mux.HandleFunc(policyPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(desc)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestJournal_FromTheService(t *testing.T) {
	state := telemetry.JournalState{Restored: 812, RestoreDuration: 2 * time.Second, Appended: 40, Failures: 2, Skipped: 1,
		Lag: 120 * time.Millisecond, Recreated: 1}
	tests := []struct {
		name    string
		state   telemetry.JournalState
		journal string
		args    []string
		check   func(t *testing.T, base, out string)
	}{
		{name: "table", state: state, journal: "sluice.idempotency.cli.pay", check: func(t *testing.T, base, out string) {
			assert.Contains(t, out, "Idempotency journal from the service at http://ops:xxxxx@"+strings.TrimPrefix(base, "http://")+retryview.MetricsPath+".")
			assert.Contains(t, out, "Handler pay journals queue cli.pay on sluice.idempotency.cli.pay.")
			assert.Regexp(t, `INSTANCE\s+HANDLERS\s+STATE\s+RESTORED KEYS\s+RESTORE DURATION\s+LAG\s+UNCONFIRMED\s+APPENDED\s+PUBLISH FAILURES\s+SKIPPED\s+RECREATED`, out)
			assert.Regexp(t, `this service\s+pay\s+ready\s+812\s+2s\s+120ms\s+0\s+40\s+2\s+1\s+1\n`, out)
		}},
		{name: "restoring", state: telemetry.JournalState{Restoring: 1, Restored: 3}, journal: "sluice.idempotency.cli.pay", check: func(t *testing.T, _, out string) {
			assert.Regexp(t, `this service\s+pay\s+restoring\s+3\s`, out)
		}},
		{name: "no journal", state: telemetry.JournalState{}, check: func(t *testing.T, _, out string) {
			assert.Contains(t, out, "No handler of the service journals its idempotency keys")
			assert.NotContains(t, out, "INSTANCE")
		}},
		{name: "JSON", state: state, journal: "sluice.idempotency.cli.pay", args: []string{"--json"}, check: func(t *testing.T, _, out string) {
			var j retryview.Journal
			require.NoError(t, json.Unmarshal([]byte(out), &j))
			assert.Equal(t, sourceService, j.Source)
			assert.Equal(t, []retryview.JournalHandler{{Name: "pay", Queue: "cli.pay", Journal: "sluice.idempotency.cli.pay"}}, j.Handlers)
			require.Len(t, j.Instances, 1)
			assert.Equal(t, retryview.JournalFigures{State: retryview.JournalReady, RestoredKeys: 812, RestoreDuration: policy.Duration(2 * time.Second),
				Lag: policy.Duration(120 * time.Millisecond), Appended: 40, Failures: 2, Skipped: 1, Recreated: 1}, j.Instances[0])
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := fakeJournalService(t, tc.state, tc.journal)
			env := map[string]string{"SLUICE_SERVICE_URL": strings.Replace(base, "http://", "http://ops:s3cr3tpw@", 1)}
			code, stdout, stderr := runTraceCLI(env, append([]string{"journal"}, tc.args...)...)
			require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			tc.check(t, base, stdout)
			assert.NotContains(t, stdout+stderr, "s3cr3tpw")
		})
	}
}

func TestJournal_FromPrometheus(t *testing.T) {
	var queries []string
	prom := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.Query().Get("query"))
		s := func(name, v string) map[string]any {
			return map[string]any{"metric": map[string]string{"__name__": name, "job": "payments", "instance": "10.0.0.7:9464"}, "value": []any{1.7e9, v}}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{"resultType": "vector", "result": []any{
			s(retryview.PromJournalRestoredKeys, "99"), s(retryview.PromJournalRestoreDuration, "0.25"), s(retryview.PromJournalLag, "1.5"),
			s(retryview.PromJournalFailures, "4"), s(retryview.PromJournalUnconfirmed, "2"),
		}}})
	}))
	t.Cleanup(prom.Close)
	env := map[string]string{"PROMETHEUS_URL": strings.Replace(prom.URL, "http://", "http://ops:s3cr3tpw@", 1), "SLUICE_SERVICE_URL": "http://127.0.0.1:1"}
	code, stdout, stderr := runTraceCLI(env, "journal")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stdout, "Idempotency journal from Prometheus at http://ops:xxxxx@")
	assert.Contains(t, stdout, "The handlers with a journal are the service's own and could not be read: cannot reach the service at http://127.0.0.1:1")
	assert.Regexp(t, `payments 10\.0\.0\.7:9464\s+–\s+failing\s+99\s+250ms\s+1\.5s\s+2\s+0\s+4\s+0\s+0\n`, stdout)
	assert.Equal(t, []string{retryview.PromJournalQuery}, queries)
	assert.NotContains(t, stdout+stderr, "s3cr3tpw")
}

func TestJournal_Failures(t *testing.T) {
	tests := []struct {
		name       string
		env        map[string]string
		args       []string
		wantCode   int
		wantStderr []string
	}{
		{name: "service unreachable", env: map[string]string{"SLUICE_SERVICE_URL": "http://ops:s3cr3tpw@127.0.0.1:1"}, wantCode: exitFailed,
			wantStderr: []string{"cannot reach the service at http://ops:xxxxx@127.0.0.1:1" + retryview.MetricsPath, "PROMETHEUS_URL", "SLUICE_SERVICE_URL"}},
		{name: "Prometheus unreachable", env: map[string]string{"PROMETHEUS_URL": "http://ops:s3cr3tpw@127.0.0.1:1"}, wantCode: exitFailed,
			wantStderr: []string{"cannot reach Prometheus at http://ops:xxxxx@127.0.0.1:1/api/v1/query"}},
		{name: "not an http URL", env: map[string]string{"SLUICE_SERVICE_URL": "ftp://x"}, wantCode: exitUsage,
			wantStderr: []string{"ftp://x is not an http(s) URL"}},
		{name: "an argument", args: []string{"extra"}, wantCode: exitUsage, wantStderr: []string{`unexpected arguments ["extra"]`}},
		{name: "help", args: []string{"-h"}, wantCode: exitOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runTraceCLI(tc.env, append([]string{"journal"}, tc.args...)...)
			assert.Equal(t, tc.wantCode, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			for _, w := range tc.wantStderr {
				assert.Contains(t, stderr, w)
			}
			assert.NotContains(t, stdout+stderr, "s3cr3tpw")
		})
	}
}

func TestJournal_IsListed(t *testing.T) {
	code, stdout, _ := runTraceCLI(nil, "help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stdout, "journal  show the idempotency journal's state")
	code, stdout, _ = runTraceCLI(nil, "journal", "-h")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stdout, "Usage: sluice journal [--json]")
}
