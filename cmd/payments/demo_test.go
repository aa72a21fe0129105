package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// demoEnv sets what the demo reads to a quick retry policy (5 retries, 20ms doubling up to
// 80ms, no jitter) and no telemetry, so the machine's environment cannot change the run;
// extra overrides it.
func demoEnv(t *testing.T, extra map[string]string) {
	t.Helper()
	env := map[string]string{
		"AMQP_URL": "", "AMQP_QUEUE_TYPE": "", "AMQP_SECONDARY_URL": "", "PAYMENTS_OUTBOX_DIR": "",
		"PAYMENTS_QUEUE": "", "PAYMENTS_OUTPUT_QUEUE": "", "PAYMENTS_PARTITIONS": "",
		"PAYMENTS_EXCHANGE": "", "PAYMENTS_OUTPUT_EXCHANGE": "", "RETRY_LEARNED": "",
		"RETRY_MAX_RETRIES": "5", "RETRY_INITIAL_DELAY": "20ms", "RETRY_MAX_DELAY": "80ms", "RETRY_JITTER": "0",
		"METRICS_ADDR": "", "RABBITMQ_MANAGEMENT_URL": "", "IDEMPOTENCY_SNAPSHOT": "",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "", "OTEL_TRACES_EXPORTER": "",
		"OTEL_SDK_DISABLED": "", "OTEL_TRACES_SAMPLER": "", "OTEL_SERVICE_NAME": "",
		"JAEGER_UI_URL": "", "JAEGER_QUERY_URL": "",
	}
	for k, v := range extra {
		env[k] = v
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// runDemo runs `payments demo` on a mix of 40 (every token is in it) and returns its output.
func runDemo(t *testing.T) string {
	t.Helper()
	cfg, err := loadConfig()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	code := demo(ctx, cfg, []string{"-n", "40", "-seed", "3"}, &out)
	require.Equal(t, 0, code, "demo failed:\n%s", out.String())
	return out.String()
}

// section returns the lines of out from the line that is title to the next blank line
// after the waterfall's table (the table follows the summary's blank line).
func section(t *testing.T, out, title string) string {
	t.Helper()
	i := strings.Index(out, "\n"+title+"\n")
	require.GreaterOrEqual(t, i, 0, "no %q in:\n%s", title, out)
	rest := out[i+1:]
	table := strings.Index(rest, "\nSPAN ")
	require.GreaterOrEqual(t, table, 0, "no table under %q", title)
	if end := strings.Index(rest[table+1:], "\n\n"); end >= 0 {
		return rest[:table+1+end+1]
	}
	return rest
}

// rowsNamed counts the table rows of a section whose name column (what comes before the
// START column's "+") ends with name.
func rowsNamed(sec, name string) int {
	n := 0
	for _, l := range strings.Split(sec, "\n") {
		start := strings.Index(l, " +")
		if strings.Contains(l, "│") && start > 0 && strings.HasSuffix(strings.TrimSpace(l[:start]), name) {
			n++
		}
	}
	return n
}

var traceLine = regexp.MustCompile(`(?m)^Trace ([0-9a-f]{32})$`)

// checkDemoOutput asserts what both runs show: lines within 80 columns, the waterfall of
// a payment retried twice and then charged, and of one dead-lettered when its five
// retries ran out, both consumed from queue. It returns the two trace ids.
func checkDemoOutput(t *testing.T, out, queue, output string) []string {
	t.Helper()
	for i, l := range strings.Split(out, "\n") {
		assert.LessOrEqual(t, utf8.RuneCountInString(l), 80, "line %d is wider than 80 columns: %q", i+1, l)
	}
	assert.Contains(t, out, "every request settled as the contract says")

	retried := section(t, out, "Retried, then charged")
	assert.Contains(t, retried, "Outcome: ✓ ack after 3 attempts (2 retries)")
	assert.Equal(t, 2, rowsNamed(retried, "✗ process "+queue), "two failed attempts:\n%s", retried)
	assert.Equal(t, 1, rowsNamed(retried, "✓ process "+queue), "then the charge:\n%s", retried)
	assert.Equal(t, 2, rowsNamed(retried, "waiting in the delay"), "a wait before each retry:\n%s", retried)
	assert.Equal(t, 1, rowsNamed(retried, "send "+output), "the success event:\n%s", retried)
	first, err := time.ParseDuration(os.Getenv("RETRY_INITIAL_DELAY"))
	require.NoError(t, err)
	assert.Contains(t, retried, "retry in "+first.String())
	assert.Contains(t, retried, "retry in "+(2*first).String())

	dead := section(t, out, "Dead-lettered when its retries ran out")
	assert.Contains(t, dead, "Outcome: ✗ dead_letter after 6 attempts (5 retries)")
	assert.Contains(t, strings.ReplaceAll(dead, "\n  ", " "), "Dead letter: sent to "+queue+".dlq at +")
	assert.Equal(t, 6, rowsNamed(dead, "✗ process "+queue), "six failed attempts:\n%s", dead)
	assert.Equal(t, 5, rowsNamed(dead, "waiting in the delay"), "a wait before each retry:\n%s", dead)
	assert.Equal(t, 1, rowsNamed(dead, "send "+queue+".dlq"), "the dead-letter hand-off:\n%s", dead)
	assert.Contains(t, dead, "dead letter (error type gateway_timeout)")
	assert.Contains(t, dead, "retries exhausted after 5 retries")

	var ids []string
	for _, m := range traceLine.FindAllStringSubmatch(out, -1) {
		ids = append(ids, m[1])
	}
	require.Len(t, ids, 2, "two waterfalls")
	assert.NotEqual(t, ids[0], ids[1])
	return ids
}

// Issue 56: `make run` shows the retry trace it promises, on the embedded broker, from
// spans recorded in the process, and says that its dead letters end with it.
func TestDemo_EmbeddedDrawsTheTraces(t *testing.T) {
	demoEnv(t, nil)
	out := runDemo(t)
	checkDemoOutput(t, out, "payments.requested", "payments.succeeded")
	assert.Regexp(t, `The embedded broker ends with this process: its \d+ dead letters \(in\npayments\.requested\.dlq\) are gone now\.`, out)
	assert.Contains(t, out, "Run against RabbitMQ (AMQP_URL) to keep them")
	assert.NotContains(t, out, "/trace/", "no Jaeger link without an OTLP endpoint")
	assert.NotContains(t, out, "sluice console --queue", "the console reads RabbitMQ, not the embedded broker")
}

// With AMQP_URL and an OTLP endpoint, the demo also links the same two traces in Jaeger
// (which received them), names the console command for its queue, and the metrics address.
func TestDemo_RabbitMQLinksJaegerConsoleAndMetrics(t *testing.T) {
	r := testenv.NewRabbit(t)
	// Short names: the waterfall's name column would cut long ones.
	queue, output := testenv.Name("pay"), testenv.Name("paid")
	r.DeleteQueues(queue, topology.DLQ(queue), topology.Archive(queue), output, topology.DLQ(output), topology.Archive(output))
	collector := &otlpCollector{}
	srv := httptest.NewServer(collector)
	defer srv.Close()
	demoEnv(t, map[string]string{
		"AMQP_URL": r.URL, "PAYMENTS_QUEUE": queue, "PAYMENTS_OUTPUT_QUEUE": output,
		"IDEMPOTENCY_JOURNAL": "off", "METRICS_ADDR": "127.0.0.1:0",
		"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL, "JAEGER_UI_URL": "http://jaeger.example:16686/",
		// Delays longer than a confirm on a busy broker, so that every retry's wait in the
		// delay is a row of its own (a 20 ms delay can end before its send's confirm).
		"RETRY_INITIAL_DELAY": "200ms", "RETRY_MAX_DELAY": "800ms",
	})
	out := runDemo(t)
	ids := checkDemoOutput(t, out, queue, output)

	exported := collector.traceIDs()
	for _, id := range ids {
		assert.Contains(t, out, "\n  http://jaeger.example:16686/trace/"+id+"\n")
		assert.True(t, exported[id], "trace %s was exported to the OTLP endpoint", id)
	}
	assert.Contains(t, out, "\n  go run ./cmd/sluice console --queue "+queue+"\n")
	assert.Regexp(t, `\d+ dead letters of this run are in `+regexp.QuoteMeta(queue)+`\.dlq`, out)
	assert.Regexp(t, `Metrics were served on http://127\.0\.0\.1:\d+/metrics while the demo ran\.`, out)
	assert.NotContains(t, out, "embedded broker")
}

// otlpCollector is an OTLP/HTTP endpoint that keeps the trace ids it receives.
type otlpCollector struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (c *otlpCollector) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	var export coltracepb.ExportTraceServiceRequest
	if err != nil || req.URL.Path != "/v1/traces" || proto.Unmarshal(body, &export) != nil {
		http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	if c.ids == nil {
		c.ids = map[string]bool{}
	}
	for _, rs := range export.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.ids[hex.EncodeToString(s.GetTraceId())] = true
			}
		}
	}
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(nil)
}

func (c *otlpCollector) traceIDs() map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]bool, len(c.ids))
	for k, v := range c.ids {
		out[k] = v
	}
	return out
}

// The progress line fits an 80-column terminal, whatever the mix's size: a big one gets
// the short labels.
func TestProgressFits(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    snapshot
		want expected
		long bool
	}{
		{name: "the default mix", s: snapshot{succeeded: 88, dead: 35, duplicates: 26, retrying: 51},
			want: expected{succeeded: 114, dead: 60, duplicates: 26}, long: true},
		{name: "a million requests", s: snapshot{succeeded: 512_345, dead: 123_456, duplicates: 99_999, retrying: 123_456},
			want: expected{succeeded: 570_000, dead: 300_000, duplicates: 100_000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line := fmt.Sprintf("%5.1fs  %s", 999.9, progress(tc.s, tc.want))
			assert.LessOrEqual(t, len(line), 79, "%q", line)
			assert.Equal(t, tc.long, strings.Contains(line, "dead-lettered"), "%q", line)
			assert.Contains(t, line, fmt.Sprintf("retrying %d", tc.s.retrying))
		})
	}
}
