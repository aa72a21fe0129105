package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/demo/paymentsim"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// lookTool returns the path of a Prometheus tool, skipping the test where it is missing
// (failing it in CI, whose .ci/run installs Debian's prometheus package).
func lookTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("SLUICE_REQUIRE_BROKER") == "1" {
			t.Fatalf("%s not found (apt-get install prometheus): %v", name, err)
		}
		t.Skipf("%s not found (apt-get install prometheus): %v", name, err)
	}
	return p
}

func TestAlertRules(t *testing.T) {
	promtool := lookTool(t, "promtool")
	dir := filepath.Join(testenv.ModuleRoot(t), "deploy", "prometheus")
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		t.Run(strings.Join(args[:2], " "), func(t *testing.T) {
			cmd := exec.Command(promtool, args...)
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
			assert.Contains(t, string(out), "SUCCESS")
		})
	}
}

// prometheus is a Prometheus server started for one test.
type prometheus struct {
	url string
}

// startPrometheus runs a Prometheus server of its own on a free loopback port, with its
// own data directory, scraping target every second and loading sluice's alert rules.
func startPrometheus(t *testing.T, target string) *prometheus {
	t.Helper()
	bin := lookTool(t, "prometheus")
	dir := t.TempDir()
	rules, err := filepath.Abs(filepath.Join(testenv.ModuleRoot(t), "deploy", "prometheus", "alerts.yml"))
	require.NoError(t, err)
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: payments
    static_configs:
      - targets: [%q]
`, rules, target)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600))
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	logs := &testenv.SyncBuffer{}
	cmd := exec.Command(bin,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn",
	)
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("prometheus logs:\n%s", logs.String())
		}
	})
	p := &prometheus{url: "http://" + addr}
	require.Eventually(t, func() bool {
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 100*time.Millisecond, "prometheus ready on %s", addr)
	return p
}

// apiResponse is the envelope of Prometheus's HTTP API.
type apiResponse struct {
	Status string          `json:"status"`
	Error  string          `json:"error"`
	Data   json.RawMessage `json:"data"`
}

func (p *prometheus) get(t *testing.T, path string, params url.Values) (json.RawMessage, error) {
	t.Helper()
	resp, err := http.Get(p.url + path + "?" + params.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var r apiResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("decode %s: %w: %s", path, err, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s %v: %s", path, params, r.Error)
	}
	return r.Data, nil
}

// sample is one series of an instant query's vector.
type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query evaluates expr now and returns its vector.
func (p *prometheus) query(t *testing.T, expr string) ([]sample, error) {
	t.Helper()
	data, err := p.get(t, "/api/v1/query", url.Values{"query": {expr}})
	if err != nil {
		return nil, err
	}
	var v struct {
		ResultType string   `json:"resultType"`
		Result     []sample `json:"result"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, err
	}
	if v.ResultType != "vector" {
		return nil, fmt.Errorf("query %q: result type %s, want vector", expr, v.ResultType)
	}
	return v.Result, nil
}

// scalar evaluates expr, which must give one series, and returns its value.
func (p *prometheus) scalar(t *testing.T, expr string) (float64, error) {
	t.Helper()
	res, err := p.query(t, expr)
	if err != nil {
		return 0, err
	}
	if len(res) != 1 {
		return 0, fmt.Errorf("query %q: %d series, want 1", expr, len(res))
	}
	s, _ := res[0].Value[1].(string)
	return strconv.ParseFloat(s, 64)
}

// eventually waits until expr evaluates to want (within delta), and fails with the last
// value or error otherwise.
func (p *prometheus) eventually(t *testing.T, expr string, want, delta float64) {
	t.Helper()
	var last string
	ok := assert.Eventually(t, func() bool {
		v, err := p.scalar(t, expr)
		if err != nil {
			last = err.Error()
			return false
		}
		last = strconv.FormatFloat(v, 'g', -1, 64)
		return v >= want-delta && v <= want+delta
	}, 60*time.Second, 250*time.Millisecond)
	if !ok {
		t.Errorf("Prometheus: %s = %s, want %g (±%g)", expr, last, want, delta)
	}
}

// TestPaymentsObservedByPrometheus runs the payment service with retries and dead letters
// while a real Prometheus scrapes it, then checks what Prometheus reports against what the
// run did: attempts, retries, the retry rate, the average retry delay, dead letters by
// error type and the DLQ depth read from RabbitMQ. It then checks that every metric the
// Grafana dashboard queries exists in the scrape, and that each query evaluates.
func TestPaymentsObservedByPrometheus(t *testing.T) {
	o := startObservedPayments(t)
	o.run(t)
	t.Run("the metrics show the run", o.checkMetrics)
	t.Run("retries and dead letters are logged, or counted as dropped", o.checkLogs)
	t.Run("dashboard metrics exist in the scrape", o.checkDashboard)
	t.Run("alert rules loaded by the server", o.checkAlertRules)
}

// What the run of TestPaymentsObservedByPrometheus does, per the example gateway's
// contract (RETRY_MAX_RETRIES=2):
//
//	tok_visa               1 attempt, succeeds
//	tok_insufficient_funds 1 attempt, dead letter (insufficient_funds)
//	tok_flaky_2            3 attempts, 2 retries (100ms, 200ms), succeeds
//	tok_timeout            3 attempts, 2 retries (100ms, 200ms), dead letter (gateway_timeout)
const (
	observedAttempts    = 10 + 4 + 4*3 + 3*3
	observedRetries     = 4*2 + 3*2
	observedDeadLetters = 4 + 3
	observedSucceeded   = 10 + 4
	// Then one payment twice: one more event, and a duplicate.
	observedAllAttempts = observedAttempts + 2
)

// observedPayments is the payments service on queue and output, ready, with a Prometheus
// scraping it.
type observedPayments struct {
	r             *testenv.Rabbit
	queue, output string
	svc           *paymentsService
	prom          *prometheus
	events        func() []arrived
}

func startObservedPayments(t *testing.T) *observedPayments {
	r := testenv.NewRabbit(t)
	queue, output := testenv.Name("obs.payments.requested"), testenv.Name("obs.payments.succeeded")
	r.DeleteQueues(queue, output, topology.DLQ(queue))
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	env := append(fastPaymentsEnv(r.URL, queue, output),
		"RETRY_MAX_RETRIES=2", // after fastPaymentsEnv's 3: the last one wins
		"METRICS_ADDR="+metricsAddr,
		"QUEUE_DEPTH_INTERVAL=500ms",
	)
	svc := startPayments(t, env)
	ready := func() int {
		resp, err := http.Get("http://" + metricsAddr + "/readyz")
		if err != nil {
			return 0
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	require.Eventually(t, func() bool { return ready() == http.StatusOK }, 60*time.Second, 50*time.Millisecond,
		"payments /readyz answers 200 once consuming")
	resp, err := http.Get("http://" + metricsAddr + "/healthz")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "/healthz")

	require.GreaterOrEqual(t, r.Count(output), 0, "ready means consuming, so the queues are declared")
	prom := startPrometheus(t, metricsAddr)
	events := collectEvents(t, r, output)
	return &observedPayments{r: r, queue: queue, output: output, svc: svc, prom: prom, events: events}
}

// run publishes the mix of payments, waits until it settled, then requests one payment
// twice.
func (o *observedPayments) run(t *testing.T) {
	r, queue, events := o.r, o.queue, o.events
	mix := []struct {
		source string
		n      int
	}{{"tok_visa", 10}, {paymentsim.TokenInsufficientFunds, 4}, {paymentsim.FlakyToken(2), 4}, {paymentsim.TokenTimeout, 3}}
	for _, m := range mix {
		for i := 0; i < m.n; i++ {
			id := testenv.Name("pay")
			r.Publish(queue, amqp091.Publishing{MessageId: id, ContentType: paymentsim.ContentTypeJSON, Body: paymentBody(id, m.source)})
		}
	}
	require.Eventually(t, func() bool {
		return len(events()) == observedSucceeded && r.Count(topology.DLQ(queue)) == observedDeadLetters
	},
		90*time.Second, 100*time.Millisecond, "the run settles: %d events, %d dead letters", observedSucceeded, observedDeadLetters)
	// A payment requested again once done is a duplicate: acked without a charge.
	dup := testenv.Name("pay")
	r.Publish(queue, amqp091.Publishing{MessageId: testenv.Name("dup"), ContentType: paymentsim.ContentTypeJSON, Body: paymentBody(dup, "tok_visa")})
	require.Eventually(t, func() bool { return len(events()) == observedSucceeded+1 }, 30*time.Second, 50*time.Millisecond)
	// The ack is counted once the attempt is over, idempotency's record included: only
	// then is the second request a plain duplicate (not one of a payment in flight).
	o.prom.eventually(t, fmt.Sprintf(`sum(sluice_messages_total{queue=%q,outcome="ack"})`, queue), observedSucceeded+1, 0)
	r.Publish(queue, amqp091.Publishing{MessageId: testenv.Name("dup"), ContentType: paymentsim.ContentTypeJSON, Body: paymentBody(dup, "tok_visa")})
}

// checkMetrics checks what Prometheus reports against what the run did, in sluice's
// metrics and in the OpenTelemetry messaging conventions' view of the same run.
func (o *observedPayments) checkMetrics(t *testing.T) {
	queue, output := o.queue, o.output
	const (
		retries, deadLetters, succeeded, allAttempts = observedRetries, observedDeadLetters, observedSucceeded, observedAllAttempts
	)
	q := fmt.Sprintf("queue=%q", queue)
	dest := fmt.Sprintf("messaging_destination_name=%q,messaging_system=\"rabbitmq\"", queue)
	metrics := []struct {
		expr        string
		want, delta float64
	}{
		{fmt.Sprintf(`sum(sluice_idempotency_hits_total{%s})`, q), 1, 0},
		{fmt.Sprintf(`sum(sluice_messages_total{%s})`, q), allAttempts, 0},
		{fmt.Sprintf(`sum(sluice_retries_total{%s})`, q), retries, 0},
		{fmt.Sprintf(`sum(sluice_retries_total{%s}) / sum(sluice_messages_total{%s})`, q, q), float64(retries) / allAttempts, 1e-9},
		{fmt.Sprintf(`sum(sluice_retry_delay_seconds_sum{%[1]s}) / sum(sluice_retry_delay_seconds_count{%[1]s})`, q), 0.15, 1e-9},
		{fmt.Sprintf(`sum(sluice_dead_letters_total{%s,error_type="insufficient_funds"})`, q), 4, 0},
		{fmt.Sprintf(`sum(sluice_dead_letters_total{%s,error_type="gateway_timeout"})`, q), 3, 0},
		{fmt.Sprintf(`sum(sluice_queue_depth{queue="%s.dlq",kind="dlq",state="ready"})`, queue), deadLetters, 0},
		{fmt.Sprintf(`sum(sluice_queue_depth{%s,kind="consumed",state="ready"})`, q), 0, 0},
		{fmt.Sprintf(`sum(sluice_queue_consumers{%s,kind="consumed"})`, q), 1, 0},
		// The conventions' view of the same run.
		{fmt.Sprintf(`sum(messaging_client_consumed_messages_total{%s,messaging_operation_name="process"})`, dest), allAttempts, 0},
		{fmt.Sprintf(`sum(messaging_process_duration_seconds_count{%s})`, dest), allAttempts, 0},
		{fmt.Sprintf(`sum(messaging_process_duration_seconds_count{%s,error_type!=""})`, dest), retries + deadLetters, 0},
		{`sum(messaging_client_sent_messages_total{messaging_destination_name="sluice.delay",messaging_operation_name="send"})`, retries, 0},
		{fmt.Sprintf(`sum(messaging_client_sent_messages_total{messaging_destination_name="%s.dlq"})`, queue), deadLetters, 0},
		{fmt.Sprintf(`sum(messaging_client_sent_messages_total{messaging_destination_name=%q})`, output), succeeded + 1, 0},
		// Every payment charged (the duplicate's original included) was journaled, once.
		{`sum(sluice_idempotency_journal_appended_total)`, succeeded + 1, 0},
		{`sum(sluice_idempotency_journal_failures_total)`, 0, 0},
		{`sum(sluice_idempotency_journal_restoring)`, 0, 0},
		{`sum(sluice_ready)`, 1, 0},
		{`sum(sluice_connection_up)`, 1, 0},
	}
	for _, m := range metrics {
		o.prom.eventually(t, m.expr, m.want, m.delta)
	}
	// The archive does not exist: absent, not an error.
	res, err := o.prom.query(t, fmt.Sprintf(`sluice_queue_depth{queue="%s.dlq.archive"}`, queue))
	require.NoError(t, err)
	assert.Empty(t, res, "a queue that does not exist has no depth series")
}

// checkLogs checks that each retry and dead letter is one info line naming the message,
// its attempt, the delay and the error type, or, past the rate limit (10 lines a second,
// which this burst exceeds), one count in sluice_log_dropped_total.
func (o *observedPayments) checkLogs(t *testing.T) {
	logs := o.svc.logs.String()
	for _, c := range []struct {
		event, line string
		want        int
	}{
		{"retry", `msg="message handed to the broker for a retry"`, observedRetries},
		{"dead_letter", `msg="message dead-lettered"`, observedDeadLetters},
	} {
		written := strings.Count(logs, c.line)
		assert.Positive(t, written, "%s lines written", c.event)
		o.prom.eventually(t, fmt.Sprintf(`sum(sluice_log_dropped_total{event=%q})`, c.event), float64(c.want-written), 0)
	}
	assert.Regexp(t, `level=INFO msg="message handed to the broker for a retry" queue=\S+ message_id=pay\S+ attempt=[12] error_type=gateway_timeout handler=payments delay=[12]00ms`, logs)
	assert.Regexp(t, `level=INFO msg="message dead-lettered" queue=\S+ message_id=pay\S+ attempt=(1 error_type=insufficient_funds|3 error_type=gateway_timeout)`, logs)
}

// checkDashboard checks that every metric the Grafana dashboard queries exists in the
// scrape, and that every query evaluates.
func (o *observedPayments) checkDashboard(t *testing.T) {
	prom, queue := o.prom, o.queue
	data, err := prom.get(t, "/api/v1/label/__name__/values", url.Values{})
	require.NoError(t, err)
	var names []string
	require.NoError(t, json.Unmarshal(data, &names))
	scraped := map[string]bool{}
	for _, n := range names {
		scraped[n] = true
	}
	exprs := dashboardExprs(t)
	require.NotEmpty(t, exprs)
	used := map[string]bool{}
	for _, expr := range exprs {
		for _, name := range metricNames(expr) {
			used[name] = true
		}
	}
	require.NotEmpty(t, used)
	var missing []string
	for name := range used {
		if !scraped[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	assert.Empty(t, missing, "metrics the dashboard queries but the service does not export")

	// Every query evaluates in Prometheus, with Grafana's variables filled in.
	for _, expr := range exprs {
		// In a PromQL string a regexp's backslash is written twice.
		re := strings.ReplaceAll(regexp.QuoteMeta(queue), `\`, `\\`)
		e := strings.NewReplacer("$__rate_interval", "1m", "$queue", re).Replace(expr)
		_, err := prom.query(t, e)
		assert.NoError(t, err, "dashboard query %s", expr)
	}
}

// checkAlertRules checks that the server loaded the alert rules and evaluates each without error.
func (o *observedPayments) checkAlertRules(t *testing.T) {
	prom := o.prom
	data, err := prom.get(t, "/api/v1/rules", url.Values{})
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Name   string `json:"name"`
				Health string `json:"health"`
			} `json:"rules"`
		} `json:"groups"`
	}
	require.NoError(t, json.Unmarshal(data, &rules))
	require.Len(t, rules.Groups, 1)
	assert.Len(t, rules.Groups[0].Rules, 9)
	require.Eventually(t, func() bool {
		data, err := prom.get(t, "/api/v1/rules", url.Values{})
		if err != nil || json.Unmarshal(data, &rules) != nil {
			return false
		}
		for _, r := range rules.Groups[0].Rules {
			if r.Health != "ok" {
				return false
			}
		}
		return true
	}, 30*time.Second, 250*time.Millisecond, "every rule evaluates without error: %+v", rules)
}

// dashboardExprs returns every query of deploy/grafana/sluice.json, panels in rows
// included, and the queue variable's.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.ModuleRoot(t), "deploy", "grafana", "sluice.json"))
	require.NoError(t, err)
	type panel struct {
		Type    string  `json:"type"`
		Title   string  `json:"title"`
		Panels  []panel `json:"panels"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	var dash struct {
		Title      string  `json:"title"`
		UID        string  `json:"uid"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(b, &dash), "the dashboard is valid JSON")
	require.NotEmpty(t, dash.Title)
	require.NotEmpty(t, dash.UID)
	var exprs []string
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type != "row" {
				require.NotEmpty(t, p.Targets, "panel %q has queries", p.Title)
			}
			for _, tg := range p.Targets {
				require.NotEmpty(t, tg.Expr, "panel %q", p.Title)
				exprs = append(exprs, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			if s, ok := q["query"].(string); ok {
				// label_values(metric, label): the metric is the query.
				metric, _, _ := strings.Cut(strings.TrimPrefix(s, "label_values("), ",")
				exprs = append(exprs, metric)
			}
		}
	}
	return exprs
}

// metricNamePattern matches sluice's and the messaging conventions' metric names in a
// PromQL expression; label names inside {} and by () never start with these prefixes.
var metricNamePattern = regexp.MustCompile(`\b(?:sluice|messaging)_[a-z0-9_]+\b`)

// metricNames returns the metric names expr uses.
func metricNames(expr string) []string {
	// Drop what is inside braces and by/without lists: label names such as
	// messaging_destination_name would read as metric names.
	stripped := regexp.MustCompile(`\{[^}]*\}|(?:by|without)\s*\([^)]*\)`).ReplaceAllString(expr, " ")
	return metricNamePattern.FindAllString(stripped, -1)
}
