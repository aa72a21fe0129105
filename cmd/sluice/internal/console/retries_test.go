package console_test

import (
	"encoding/json"
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/cmd/sluice/internal/retryview"
)

// rowOf returns the cells of the retries table's row of errType in handler's section of
// page, by data-field, as text.
func rowOf(t *testing.T, page, handler, errType string) map[string]string {
	t.Helper()
	sec := regexp.MustCompile(`(?s)<section class="handler-retries" id="handler-` + regexp.QuoteMeta(handler) + `".*?</section>`).FindString(page)
	require.NotEmpty(t, sec, "no section of handler %s in:\n%s", handler, page)
	tr := regexp.MustCompile(`(?s)<tr data-error-type="` + regexp.QuoteMeta(errType) + `"[^>]*>(.*?)</tr>`).FindStringSubmatch(sec)
	require.NotNil(t, tr, "no row of %s in handler %s's section:\n%s", errType, handler, sec)
	cells := map[string]string{}
	tags := regexp.MustCompile(`<[^>]+>`)
	for _, m := range regexp.MustCompile(`(?s)<td[^>]*data-field="([^"]+)"[^>]*>(.*?)</td>`).FindAllStringSubmatch(tr[1], -1) {
		cells[m[1]] = html.UnescapeString(strings.TrimSpace(tags.ReplaceAllString(strings.ReplaceAll(m[2], "<br>", " · "), "")))
	}
	return cells
}

func TestRetriesPages_FromTheService(t *testing.T) {
	service := newFakeService(t)
	withSecret := strings.Replace(service, "http://", "http://ops:s3cr3tpw@", 1)
	masked := strings.Replace(service, "http://", "http://ops:xxxxx@", 1)
	fx := newFixture(t, func(c *console.Config) { c.ServiceURL = withSecret })

	tests := []struct {
		name    string
		path    string
		code    int
		want    []string
		notWant []string
		check   func(t *testing.T, body string)
	}{
		{name: "overview", path: "/retries", code: http.StatusOK,
			want: []string{"Read from the service at " + masked + retryview.RetriesPath + ", over the last 1h.",
				`<a href="/retries/payments">payments</a>`, `<a href="/retries/refunds">refunds</a>`,
				"Learned retry policy: stops retrying an error type below 1% recovered, after 20 ended messages"},
			check: func(t *testing.T, body string) {
				assert.Equal(t, map[string]string{"failed": "38", "retries": "91", "in-flight": "3", "recovered": "25", "recovered-pct": "71.4%",
					"median": "2", "exhausted": "10", "permanent": "0", "retry-unlikely": "0", "other": "0",
					"learned": "retry · 25 of 35 recovered in the last hour"}, rowOf(t, body, "payments", "gateway_timeout"))
				assert.Equal(t, map[string]string{"failed": "12", "retries": "0", "in-flight": "0", "recovered": "0", "recovered-pct": "0.0%",
					"median": "–", "exhausted": "0", "permanent": "12", "retry-unlikely": "0", "other": "0",
					"learned": "retry (not enough evidence) · retried: too little evidence (0 of 20 messages needed ended in the window)"},
					rowOf(t, body, "payments", "insufficient_funds"))
				ledger := rowOf(t, body, "payments", "ledger_unavailable")
				assert.Equal(t, "stop retrying (exploring 5%) · 0 of 40 recovered in the last hour", ledger["learned"])
				assert.Equal(t, []string{"49", "40", "9"}, []string{ledger["failed"], ledger["exhausted"], ledger["retry-unlikely"]})
				assert.Contains(t, body, `<tr data-error-type="ledger_unavailable" class="stopped">`)
				assert.Equal(t, "83.3%", rowOf(t, body, "refunds", "psp_timeout")["recovered-pct"])
			}},
		{name: "one handler", path: "/retries/refunds", code: http.StatusOK,
			want:    []string{"Retries of <code>refunds</code>", "Maximum attempts 6 (5 retries).", `href="/policy/refunds"`},
			notWant: []string{"gateway_timeout"},
			check: func(t *testing.T, body string) {
				assert.Equal(t, "5", rowOf(t, body, "refunds", "psp_timeout")["recovered"])
			}},
		{name: "a handler without failures", path: "/retries/nobody", code: http.StatusOK,
			want: []string{"No failures of handler <code>nobody</code> in the window."}},
		{name: "a bad window", path: "/retries?window=1ms", code: http.StatusBadRequest,
			want: []string{`window &#34;1ms&#34; is not a duration of at least 1s`}},
		{name: "API", path: "/api/v1/retries", code: http.StatusOK, check: func(t *testing.T, body string) {
			var r retryview.Retries
			require.NoError(t, json.Unmarshal([]byte(body), &r))
			assert.Equal(t, retryview.SourceService, r.Source)
			assert.Equal(t, masked+retryview.RetriesPath, r.URL)
			require.Len(t, r.Types, 5)
			assert.Equal(t, [2]string{"payments", "gateway_timeout"}, [2]string{r.Types[0].Handler, r.Types[0].ErrorType})
			assert.Equal(t, 2, r.Types[0].MedianRecoveryAttempt)
		}},
		{name: "API, one handler", path: "/api/v1/retries?handler=refunds", code: http.StatusOK, check: func(t *testing.T, body string) {
			var r retryview.Retries
			require.NoError(t, json.Unmarshal([]byte(body), &r))
			require.Len(t, r.Types, 1)
			assert.Equal(t, "psp_timeout", r.Types[0].ErrorType)
		}},
		{name: "policy", path: "/policy", code: http.StatusOK,
			want: []string{"Read from the service at " + masked + retryview.PolicyPath + ".",
				`Handler <a href="/policy/payments">payments</a>`, `Handler <a href="/policy/refunds">refunds</a>`,
				`<a href="/queues/payments.requested"><code>payments.requested.dlq</code></a>`,
				`<a href="/queues/payments.requested?source=archive"><code>payments.requested.dlq.archive</code></a>`,
				"<th>Maximum attempts</th><td>6 (5 retries)</td>",
				"<th>Settle bound</th><td>every delivery settled within 1m41s of its delivery, prefetch wait included; RabbitMQ&#39;s consumer timeout must not be lower</td>",
				"<th>Backoff</th><td>500ms × 2 up to 10s, jitter ±20%</td>",
				`<tr data-retry="3"><td class="num">3</td><td class="num">4</td><td class="num">2s</td><td>1.6s – 2.4s</td><td class="num">+3.5s</td></tr>`,
				"<th>Retry budget</th><td>0.2 of first attempts over 10s (at least 1/s)",
				"<th>Circuit breaker</th><td>card-gateway (closed), open 30s then 1 half-open probes; while open: pause</td>",
				`<tr data-class="permanent"><td><code>permanent</code></td><td>dead-lettered to payments.requested.dlq at once</td></tr>`,
				`<tr data-error-type="ledger_unavailable" class="stopped"><td><code>ledger_unavailable</code></td><td class="decision">stop retrying (exploring 5%)</td><td>dead-lettered at once (5% explored): 0 of 40 recovered in the last hour</td></tr>`,
				"<th>Idempotency</th><td>none</td>"}},
		{name: "policy of one handler", path: "/policy/refunds", code: http.StatusOK,
			want: []string{"Retry policy of <code>refunds</code>", "refunds.requested.dlq"}, notWant: []string{"payments.requested"}},
		{name: "policy of no handler", path: "/policy/nope", code: http.StatusNotFound,
			want: []string{"has no handler &#34;nope&#34;"}},
		{name: "policy API", path: "/api/v1/policy", code: http.StatusOK, check: func(t *testing.T, body string) {
			var p retryview.Policy
			require.NoError(t, json.Unmarshal([]byte(body), &p))
			assert.Equal(t, masked+retryview.PolicyPath, p.URL)
			require.Len(t, p.Handlers, 2)
			assert.Equal(t, 6, p.Handlers[0].Retry.MaxAttempts)
		}},
		{name: "policy API, no such handler", path: "/api/v1/policy?handler=nope", code: http.StatusNotFound,
			want: []string{`"status": 404`, `has no handler \"nope\"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := fx.get(t, tc.path)
			require.Equal(t, tc.code, code, body)
			for _, w := range tc.want {
				assert.Contains(t, body, w)
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

func TestRetriesPages_FromPrometheus(t *testing.T) {
	prom := newFakePrometheus(t)
	withSecret := strings.Replace(prom.URL, "http://", "http://ops:s3cr3tpw@", 1)
	masked := strings.Replace(prom.URL, "http://", "http://ops:xxxxx@", 1)
	tests := []struct {
		name    string
		service string
		path    string
		want    []string
		check   func(t *testing.T, body string)
	}{
		{name: "with the service's learned view", service: newFakeService(t), path: "/retries?window=30m",
			want: []string{"Read from Prometheus at " + masked + ", over the last 30m.", "PROMETHEUS_URL is set",
				"The learned policy&#39;s view is the service&#39;s own, read from http://"},
			check: func(t *testing.T, body string) {
				assert.Equal(t, map[string]string{"failed": "70", "retries": "121", "in-flight": "–", "recovered": "50", "recovered-pct": "71.4%",
					"median": "2", "exhausted": "20", "permanent": "0", "retry-unlikely": "0", "other": "0",
					"learned": "retry · 25 of 35 recovered in the last hour"}, rowOf(t, body, "payments", "gateway_timeout"))
				assert.Equal(t, "stop retrying (exploring 5%) · 0 of 40 recovered in the last hour", rowOf(t, body, "payments", "ledger_unavailable")["learned"])
			}},
		{name: "without the service", service: "http://127.0.0.1:1", path: "/retries",
			want: []string{"Read from Prometheus at " + masked + ", over the last 1h.",
				"The learned policy&#39;s view is the service&#39;s own and could not be read: cannot reach the service at http://127.0.0.1:1"},
			check: func(t *testing.T, body string) {
				assert.Equal(t, "–", rowOf(t, body, "payments", "gateway_timeout")["learned"])
			}},
		{name: "API", service: "http://127.0.0.1:1", path: "/api/v1/retries?handler=payments",
			check: func(t *testing.T, body string) {
				var r retryview.Retries
				require.NoError(t, json.Unmarshal([]byte(body), &r))
				assert.Equal(t, retryview.SourcePrometheus, r.Source)
				assert.Equal(t, masked, r.URL)
				assert.Equal(t, 3600.0, r.WindowSeconds)
				require.Len(t, r.Types, 2)
				assert.Equal(t, int64(50), r.Types[0].Recovered)
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t, func(c *console.Config) { c.ServiceURL, c.PrometheusURL = tc.service, withSecret })
			code, body := fx.get(t, tc.path)
			require.Equal(t, http.StatusOK, code, body)
			for _, w := range tc.want {
				assert.Contains(t, body, w)
			}
			if tc.check != nil {
				tc.check(t, body)
			}
			assert.NotContains(t, body, "s3cr3tpw")
		})
	}
}

// TestRetriesPages_Unreachable: a source that does not answer is a page that says so,
// which source it was (password masked) and where the setting is, never a bare 500.
func TestRetriesPages_Unreachable(t *testing.T) {
	down := "http://ops:s3cr3tpw@127.0.0.1:1"
	tests := []struct {
		name string
		cfg  func(c *console.Config)
		path string
		code int
		want []string
	}{
		{name: "service: retries", cfg: func(c *console.Config) { c.ServiceURL = down }, path: "/retries", code: http.StatusBadGateway,
			want: []string{`id="retries-error"`, "The retry statistics could not be read: cannot reach the service at http://ops:xxxxx@127.0.0.1:1" + retryview.RetriesPath,
				"Read from the service at http://ops:xxxxx@127.0.0.1:1" + retryview.RetriesPath, "SLUICE_SERVICE_URL", "PROMETHEUS_URL", "signed in as"}},
		{name: "service: one handler", cfg: func(c *console.Config) { c.ServiceURL = down }, path: "/retries/payments", code: http.StatusBadGateway,
			want: []string{"cannot reach the service at http://ops:xxxxx@127.0.0.1:1"}},
		{name: "service: policy", cfg: func(c *console.Config) { c.ServiceURL = down }, path: "/policy", code: http.StatusBadGateway,
			want: []string{`id="policy-error"`, "The retry policy could not be read: cannot reach the service at http://ops:xxxxx@127.0.0.1:1" + retryview.PolicyPath}},
		{name: "service: retries API", cfg: func(c *console.Config) { c.ServiceURL = down }, path: "/api/v1/retries", code: http.StatusBadGateway,
			want: []string{`"status": 502`, "cannot reach the service at http://ops:xxxxx@127.0.0.1:1"}},
		{name: "service: policy API", cfg: func(c *console.Config) { c.ServiceURL = down }, path: "/api/v1/policy", code: http.StatusBadGateway,
			want: []string{`"status": 502`, "cannot reach the service"}},
		{name: "Prometheus", cfg: func(c *console.Config) { c.PrometheusURL = down }, path: "/retries", code: http.StatusBadGateway,
			want: []string{"Read from Prometheus at http://ops:xxxxx@127.0.0.1:1", "could not be read: cannot reach Prometheus at http://ops:xxxxx@127.0.0.1:1/api/v1/query"}},
		{name: "not an http URL", cfg: func(c *console.Config) { c.ServiceURL = "ftp://x" }, path: "/policy", code: http.StatusInternalServerError,
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

// TestRetriesPages_Reader: the retry pages are reads, so a read-only token sees them.
func TestRetriesPages_Reader(t *testing.T) {
	fx := newFixture(t, func(c *console.Config) {
		c.Token, c.ReadToken = "op-secret", "carol:read-secret"
		c.ServiceURL = newFakeService(t)
	})
	tests := []struct {
		path string
		want string
	}{
		{"/retries", "signed in as <strong>carol</strong> (read-only)"},
		{"/retries/payments", "gateway_timeout"},
		{"/policy", "payments.requested.dlq"},
		{"/policy/refunds", "refunds.requested.dlq"},
		{"/api/v1/retries", `"source": "service"`},
		{"/api/v1/policy", `"name": "payments"`},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			code, body := fx.do(t, http.MethodGet, tc.path, "", bearer("read-secret"))
			assert.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, tc.want)
		})
	}
	code, _ := fx.get(t, "/retries")
	assert.Equal(t, http.StatusUnauthorized, code, "no token, no page")
}

// TestRetriesPages_Linked: every page's navigation leads to the retry pages.
func TestRetriesPages_Linked(t *testing.T) {
	fx := newFixture(t, func(c *console.Config) { c.ServiceURL = "http://127.0.0.1:1" })
	for _, path := range []string{"/", "/audit", "/retries", "/policy"} {
		t.Run(path, func(t *testing.T) {
			_, body := fx.get(t, path)
			assert.Contains(t, body, `<a href="/retries" id="nav-retries">Retries</a>`)
			assert.Contains(t, body, `<a href="/policy" id="nav-policy">Retry policy</a>`)
		})
	}
}
