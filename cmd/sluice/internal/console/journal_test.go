package console_test

import (
	"context"
	"encoding/json"
	"html"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/cmd/sluice/internal/retryview"
	"github.com/sluice-go/sluice/policy"
	"github.com/sluice-go/sluice/telemetry"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

// journalHandlers is a service's description with payments journaling its keys and
// refunds keeping none.
func journalHandlers(journal string) policy.Description {
	d := policy.Description{Handlers: []policy.HandlerDescription{
		{Name: "payments", Queue: "payments.requested", Idempotency: &policy.IdempotencyDescription{Step: "*idempotency.Guard", Key: "payment_id", Journal: journal}},
		{Name: "refunds", Queue: "refunds.requested"},
	}}
	return d
}

// newFakeJournalService serves, as a service's metrics server does, the journal metrics
// of state through the real exporter (otelsetup, so the names are the ones the console
// must read) on /metrics, and desc on /debug/sluice/policy (nil: 404, an older service).
// A nil state registers no journal metrics.
func newFakeJournalService(t *testing.T, state *telemetry.JournalState, desc *policy.Description) string {
	t.Helper()
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	providers, err := otelsetup.Setup(ctx, otelsetup.Config{ServiceName: "journal-console"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = providers.Shutdown(context.Background()) })
	if state != nil {
		inst, err := providers.Instrumentation()
		require.NoError(t, err)
		reg, err := inst.RegisterJournal(func() telemetry.JournalState { return *state })
		require.NoError(t, err)
		t.Cleanup(func() { _ = reg.Unregister() })
	}
	mux := http.NewServeMux()
	mux.Handle(retryview.MetricsPath, providers.MetricsHandler())
	mux.HandleFunc(retryview.PolicyPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if desc == nil {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":"no stack to describe: the service has not called Providers.ServeStack"}`))
			return
		}
		_ = json.NewEncoder(w).Encode(desc)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// newFakeJournalPrometheus answers the journal query as Prometheus does, with two
// instances of payments: one restored and ready, one still restoring whose appends fail.
func newFakeJournalPrometheus(t *testing.T, empty bool) *httptest.Server {
	t.Helper()
	type sample struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	}
	s := func(instance, name, v string) sample {
		return sample{Metric: map[string]string{"__name__": name, "job": "payments", "instance": instance}, Value: [2]any{1.7e9, v}}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/query" || r.URL.Query().Get("query") != retryview.PromJournalQuery {
			http.Error(w, `{"status":"error","errorType":"bad_data","error":"unexpected query"}`, http.StatusBadRequest)
			return
		}
		result := []sample{}
		if !empty {
			result = []sample{
				s("10.0.0.7:9464", retryview.PromJournalRestoredKeys, "1200"),
				s("10.0.0.7:9464", retryview.PromJournalRestoreDuration, "2.5"),
				s("10.0.0.7:9464", retryview.PromJournalRestoring, "0"),
				s("10.0.0.7:9464", retryview.PromJournalLag, "0.042"),
				s("10.0.0.7:9464", retryview.PromJournalUnconfirmed, "0"),
				s("10.0.0.7:9464", retryview.PromJournalAppended, "5000"),
				s("10.0.0.7:9464", retryview.PromJournalFailures, "1"),
				s("10.0.0.7:9464", retryview.PromJournalSkipped, "2"),
				s("10.0.0.7:9464", retryview.PromJournalRecreated, "0"),
				s("10.0.0.8:9464", retryview.PromJournalRestoredKeys, "300"),
				s("10.0.0.8:9464", retryview.PromJournalRestoring, "1"),
				s("10.0.0.8:9464", retryview.PromJournalFailures, "7"),
				s("10.0.0.8:9464", retryview.PromJournalUnconfirmed, "4"),
				s("10.0.0.8:9464", retryview.PromJournalRecreated, "1"),
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{"resultType": "vector", "result": result}})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// journalRow returns the cells of the journal table's row of instance, by data-field, as
// text.
func journalRow(t *testing.T, page, instance string) map[string]string {
	t.Helper()
	tr := regexp.MustCompile(`(?s)<tr data-instance="` + regexp.QuoteMeta(instance) + `"[^>]*>(.*?)</tr>`).FindStringSubmatch(page)
	require.NotNil(t, tr, "no row of instance %s in:\n%s", instance, page)
	cells := map[string]string{}
	for _, m := range regexp.MustCompile(`(?s)<td[^>]*data-field="([^"]+)"[^>]*>(.*?)</td>`).FindAllStringSubmatch(tr[1], -1) {
		cells[m[1]] = html.UnescapeString(strings.TrimSpace(m[2]))
	}
	return cells
}

// The figures a service's own metrics report, the handlers its description names, and a
// service without a journal or without the metrics: a page that says so, status 200.
func TestJournalPage_FromTheService(t *testing.T) {
	restored := &telemetry.JournalState{Restored: 1234, RestoreDuration: 1500 * time.Millisecond, Appended: 77, Failures: 3,
		Skipped: 2, Lag: 35 * time.Millisecond, Unconfirmed: 0, Recreated: 1}
	withJournal := journalHandlers("sluice.idempotency.payments.requested")
	noJournal := journalHandlers("")
	tests := []struct {
		name    string
		service func(t *testing.T) string
		path    string
		want    []string
		notWant []string
		check   func(t *testing.T, body string)
	}{
		{name: "restored and ready", service: func(t *testing.T) string { return newFakeJournalService(t, restored, &withJournal) }, path: "/journal",
			want: []string{"(SLUICE_SERVICE_URL; set PROMETHEUS_URL to read Prometheus instead.)",
				`<tr data-handler="payments"><td><a href="/policy/payments">payments</a></td><td><a href="/queues/payments.requested"><code>payments.requested</code></a></td><td><code>sluice.idempotency.payments.requested</code></td></tr>`},
			notWant: []string{`data-handler="refunds"`, `id="no-journal"`, `id="journal-shared"`, `id="journal-handlers-note"`},
			check: func(t *testing.T, body string) {
				assert.Contains(t, body, "The handlers with a journal are the service's own, read from http://ops:xxxxx@")
				assert.Equal(t, map[string]string{"handlers": "payments", "state": "ready", "restored-keys": "1234", "restore-duration": "1.5s",
					"lag": "35ms", "unconfirmed": "0", "appended": "77", "failures": "3", "skipped": "2", "recreated": "1"},
					journalRow(t, body, "this service"))
			}},
		{name: "restoring", service: func(t *testing.T) string {
			return newFakeJournalService(t, &telemetry.JournalState{Restoring: 1, Restored: 40}, &withJournal)
		}, path: "/journal", check: func(t *testing.T, body string) {
			assert.Equal(t, "restoring (1 not caught up)", journalRow(t, body, "this service")["state"])
			assert.Contains(t, body, `<tr data-instance="this service" class="stopped">`)
		}},
		{name: "appends failing", service: func(t *testing.T) string {
			return newFakeJournalService(t, &telemetry.JournalState{Unconfirmed: 5, Failures: 9}, &withJournal)
		}, path: "/journal", check: func(t *testing.T, body string) {
			assert.Equal(t, "failing", journalRow(t, body, "this service")["state"])
		}},
		{name: "no handler journals", service: func(t *testing.T) string { return newFakeJournalService(t, &telemetry.JournalState{}, &noJournal) }, path: "/journal",
			want:    []string{`id="no-journal"`, "No handler of the service journals its idempotency keys", "IDEMPOTENCY_JOURNAL=off"},
			notWant: []string{`id="journal"`, `id="journal-error"`}},
		{name: "no journal metrics", service: func(t *testing.T) string { return newFakeJournalService(t, nil, nil) }, path: "/journal",
			want: []string{`id="no-journal"`, "The service reports no sluice_idempotency_journal_* metrics",
				"The handlers with a journal are the service's own and could not be read", "answered 404 Not Found: no stack to describe"},
			notWant: []string{`id="journal-error"`}},
		{name: "figures without the description", service: func(t *testing.T) string { return newFakeJournalService(t, restored, nil) }, path: "/journal",
			want: []string{`id="journal-handlers-note"`},
			check: func(t *testing.T, body string) {
				row := journalRow(t, body, "this service")
				assert.Equal(t, []string{"–", "1234"}, []string{row["handlers"], row["restored-keys"]})
			}},
		{name: "API", service: func(t *testing.T) string { return newFakeJournalService(t, restored, &withJournal) }, path: "/api/v1/journal",
			check: func(t *testing.T, body string) {
				var j retryview.Journal
				require.NoError(t, json.Unmarshal([]byte(body), &j))
				assert.Equal(t, retryview.SourceService, j.Source)
				assert.True(t, strings.HasSuffix(j.URL, retryview.MetricsPath), j.URL)
				assert.Equal(t, []retryview.JournalHandler{{Name: "payments", Queue: "payments.requested", Journal: "sluice.idempotency.payments.requested"}}, j.Handlers)
				require.Len(t, j.Instances, 1)
				assert.Equal(t, retryview.JournalFigures{State: retryview.JournalReady, RestoredKeys: 1234, RestoreDuration: policy.Duration(1500 * time.Millisecond),
					Lag: policy.Duration(35 * time.Millisecond), Appended: 77, Failures: 3, Skipped: 2, Recreated: 1}, j.Instances[0])
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			service := tc.service(t)
			withSecret := strings.Replace(service, "http://", "http://ops:s3cr3tpw@", 1)
			masked := strings.Replace(service, "http://", "http://ops:xxxxx@", 1)
			fx := newFixture(t, func(c *console.Config) { c.ServiceURL = withSecret })
			code, body := fx.get(t, tc.path)
			require.Equal(t, http.StatusOK, code, body)
			if !strings.HasPrefix(tc.path, "/api/") {
				assert.Contains(t, body, "Read from the service at "+masked+retryview.MetricsPath+".")
			}
			text := html.UnescapeString(body)
			for _, w := range tc.want {
				assert.Contains(t, text, html.UnescapeString(w))
			}
			for _, w := range tc.notWant {
				assert.NotContains(t, body, w)
			}
			if tc.check != nil {
				tc.check(t, body)
			}
			assert.NotContains(t, body, "s3cr3tpw")
		})
	}
}

// With PROMETHEUS_URL the figures are Prometheus's, one row per instance, and the handlers
// still the service's.
func TestJournalPage_FromPrometheus(t *testing.T) {
	withJournal := journalHandlers("sluice.idempotency.payments.requested")
	tests := []struct {
		name    string
		empty   bool
		service func(t *testing.T) string
		want    []string
		check   func(t *testing.T, body string)
	}{
		{name: "two instances", service: func(t *testing.T) string { return newFakeJournalService(t, nil, &withJournal) },
			want: []string{"PROMETHEUS_URL is set", `<code>sluice.idempotency.payments.requested</code>`},
			check: func(t *testing.T, body string) {
				assert.Equal(t, map[string]string{"handlers": "payments", "state": "ready", "restored-keys": "1200", "restore-duration": "2.5s",
					"lag": "42ms", "unconfirmed": "0", "appended": "5000", "failures": "1", "skipped": "2", "recreated": "0"},
					journalRow(t, body, "payments 10.0.0.7:9464"))
				assert.Equal(t, map[string]string{"handlers": "payments", "state": "restoring (1 not caught up)", "restored-keys": "300", "restore-duration": "0s",
					"lag": "0s", "unconfirmed": "4", "appended": "0", "failures": "7", "skipped": "0", "recreated": "1"},
					journalRow(t, body, "payments 10.0.0.8:9464"))
			}},
		{name: "without the service", service: func(*testing.T) string { return "http://127.0.0.1:1" },
			want: []string{"The handlers with a journal are the service's own and could not be read: cannot reach the service at http://127.0.0.1:1"},
			check: func(t *testing.T, body string) {
				assert.Equal(t, "–", journalRow(t, body, "payments 10.0.0.7:9464")["handlers"])
			}},
		{name: "no series", empty: true, service: func(*testing.T) string { return "http://127.0.0.1:1" },
			want: []string{`id="no-journal"`, "Prometheus has no sluice_idempotency_journal_* series"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prom := newFakeJournalPrometheus(t, tc.empty)
			withSecret := strings.Replace(prom.URL, "http://", "http://ops:s3cr3tpw@", 1)
			masked := strings.Replace(prom.URL, "http://", "http://ops:xxxxx@", 1)
			fx := newFixture(t, func(c *console.Config) { c.ServiceURL, c.PrometheusURL = tc.service(t), withSecret })
			code, body := fx.get(t, "/journal")
			require.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, "Read from Prometheus at "+masked+".")
			for _, w := range tc.want {
				assert.Contains(t, html.UnescapeString(body), w)
			}
			if tc.check != nil {
				tc.check(t, body)
			}
			assert.NotContains(t, body, "s3cr3tpw")
		})
	}
}

// A source that does not answer is a page that says so and which source it was, never a
// bare 500.
func TestJournalPage_Unreachable(t *testing.T) {
	down := "http://ops:s3cr3tpw@127.0.0.1:1"
	tests := []struct {
		name string
		cfg  func(c *console.Config)
		path string
		code int
		want []string
	}{
		{name: "service", cfg: func(c *console.Config) { c.ServiceURL = down }, path: "/journal", code: http.StatusBadGateway,
			want: []string{`id="journal-error"`, "could not be read: cannot reach the service at http://ops:xxxxx@127.0.0.1:1" + retryview.MetricsPath,
				"Read from the service at http://ops:xxxxx@127.0.0.1:1" + retryview.MetricsPath, "SLUICE_SERVICE_URL", "signed in as"}},
		{name: "Prometheus", cfg: func(c *console.Config) { c.PrometheusURL = down }, path: "/journal", code: http.StatusBadGateway,
			want: []string{"Read from Prometheus at http://ops:xxxxx@127.0.0.1:1", "cannot reach Prometheus at http://ops:xxxxx@127.0.0.1:1/api/v1/query"}},
		{name: "API", cfg: func(c *console.Config) { c.ServiceURL = down }, path: "/api/v1/journal", code: http.StatusBadGateway,
			want: []string{`"status": 502`, "cannot reach the service at http://ops:xxxxx@127.0.0.1:1"}},
		{name: "not an http URL", cfg: func(c *console.Config) { c.ServiceURL = "ftp://x" }, path: "/journal", code: http.StatusInternalServerError,
			want: []string{"ftp://x is not an http(s) URL"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t, tc.cfg)
			code, body := fx.get(t, tc.path)
			assert.Equal(t, tc.code, code, body)
			for _, w := range tc.want {
				assert.Contains(t, html.UnescapeString(body), w)
			}
			assert.NotContains(t, body, "s3cr3tpw")
			assert.NotContains(t, body, "goroutine", "no stack")
		})
	}
}

// Every page's navigation leads to the journal page, and a read-only token sees it.
func TestJournalPage_LinkedAndReadable(t *testing.T) {
	fx := newFixture(t, func(c *console.Config) { c.ServiceURL = "http://127.0.0.1:1" })
	for _, path := range []string{"/", "/audit", "/retries", "/policy", "/journal"} {
		t.Run(path, func(t *testing.T) {
			_, body := fx.get(t, path)
			assert.Contains(t, body, `<a href="/journal" id="nav-journal">Journal</a>`)
		})
	}
	t.Run("read-only", func(t *testing.T) {
		withJournal := journalHandlers("sluice.idempotency.payments.requested")
		service := newFakeJournalService(t, &telemetry.JournalState{Restored: 5}, &withJournal)
		fx := newFixture(t, func(c *console.Config) {
			c.Token, c.ReadToken = "op-secret", "carol:read-secret"
			c.ServiceURL = service
		})
		code, body := fx.do(t, http.MethodGet, "/journal", "", bearer("read-secret"))
		assert.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, "5", journalRow(t, body, "this service")["restored-keys"])
		code, _ = fx.get(t, "/journal")
		assert.Equal(t, http.StatusUnauthorized, code, "no token, no page")
	})
}
