package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/jaeger"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

// tracingStack is telemetry exporting to the local Jaeger under a service name of its own,
// so that a test finds exactly the traces it made, however many runs Jaeger holds.
type tracingStack struct {
	service   string
	queryURL  string
	providers *otelsetup.Providers
	tel       *telemetry.Config          // a stack's telemetry, on providers
	inst      *telemetry.Instrumentation // a producer's, on providers
	jaeger    *jaeger.Client
}

// tracingRetry is a fast policy without jitter: 100ms, then 200ms, ...
func tracingRetry(maxRetries int) retry.Config {
	return retry.Config{MaxRetries: maxRetries, InitialDelay: 100 * time.Millisecond, Multiplier: 2, MaxDelay: time.Second, Jitter: retry.NoJitter}
}

// newTracingStack sets up telemetry as a service would (telemetry.Setup from the OTEL_*
// environment), exporting OTLP/HTTP to the Jaeger that scripts/jaeger-start.sh runs. With
// metrics, it also serves Prometheus metrics on a free port. Call it before start, so that
// the providers are shut down after the stack.
func newTracingStack(t *testing.T, metrics bool) *tracingStack {
	t.Helper()
	queryURL := testenv.JaegerQueryURL(t)
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	if endpoint == "" {
		endpoint = "http://127.0.0.1:4318"
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	service := "sluice-e2e-" + hex.EncodeToString(suffix)
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
		"OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_TRACES_SAMPLER", "OTEL_RESOURCE_ATTRIBUTES"} {
		t.Setenv(name, "")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_SERVICE_NAME", service)
	// Export every 100ms rather than every 5s: the test waits for the spans in Jaeger.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")

	cfg := otelsetup.Config{ServiceName: "overridden-by-OTEL_SERVICE_NAME"}
	if metrics {
		cfg.MetricsAddr = "127.0.0.1:0"
	}
	p, err := otelsetup.Setup(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, p.Shutdown(ctx), "telemetry shutdown")
	})
	require.Equal(t, "otlp/http", p.TracesExporter())
	tel := &telemetry.Config{TracerProvider: p.TracerProvider, MeterProvider: p.MeterProvider, Propagator: p.Propagator}
	inst, err := telemetry.New(*tel)
	require.NoError(t, err)

	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	return &tracingStack{
		service:   service,
		queryURL:  queryURL,
		providers: p,
		tel:       tel,
		inst:      inst,
		jaeger:    &jaeger.Client{BaseURL: queryURL, HTTPClient: &http.Client{Transport: transport, Timeout: 5 * time.Second}},
	}
}

// traces returns the traces Jaeger holds of this test's service that carry messageID,
// after flushing the spans still buffered here.
func (ts *tracingStack) traces(t *testing.T, messageID string) ([]jaeger.Trace, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ts.providers.TracerProvider.ForceFlush(ctx); err != nil {
		return nil, err
	}
	return ts.jaeger.FindTraces(ctx, ts.service, map[string]string{"messaging.message.id": messageID}, time.Hour)
}

// awaitTrace waits until Jaeger holds the spans of messageID that complete accepts (Jaeger
// ingests a moment after the export), then requires that they are one trace.
func (ts *tracingStack) awaitTrace(t *testing.T, messageID string, complete func(spans []jaeger.Span) bool) jaeger.Trace {
	t.Helper()
	var traces []jaeger.Trace
	var err error
	ok := assert.Eventually(t, func() bool {
		traces, err = ts.traces(t, messageID)
		var all []jaeger.Span
		for _, tr := range traces {
			all = append(all, tr.Spans...)
		}
		return err == nil && complete(all)
	}, 20*time.Second, 100*time.Millisecond)
	if !ok {
		t.Fatalf("spans of message %s in Jaeger (service %s): last error %v, got:\n%s", messageID, ts.service, err, describeTraces(traces))
	}
	require.Len(t, traces, 1, "the spans of message %s are one trace:\n%s", messageID, describeTraces(traces))
	return traces[0]
}

// describeTraces lists spans for failure messages.
func describeTraces(traces []jaeger.Trace) string {
	var b strings.Builder
	for _, tr := range traces {
		fmt.Fprintf(&b, "trace %s\n", tr.TraceID)
		for _, s := range tr.Spans {
			fmt.Fprintf(&b, "  %s %q parent=%s attempt=%s outcome=%s failed=%v\n", s.SpanID, s.OperationName,
				s.ParentSpanID, s.TagString("sluice.attempt"), s.TagString("sluice.outcome"), s.Failed())
		}
	}
	return b.String()
}

// countNamed counts the spans called name.
func countNamed(spans []jaeger.Span, name string) int {
	n := 0
	for _, s := range spans {
		if s.OperationName == name {
			n++
		}
	}
	return n
}

// byAttempt orders consumer spans by their sluice.attempt.
func byAttempt(spans []jaeger.Span) []jaeger.Span {
	out := append([]jaeger.Span(nil), spans...)
	sort.SliceStable(out, func(i, j int) bool {
		a, _ := out[i].Tags["sluice.attempt"].(int64)
		b, _ := out[j].Tags["sluice.attempt"].(int64)
		return a < b
	})
	return out
}

// tracingCLI runs the sluice binary with args and the extra environment, and returns
// stdout, stderr and the exit code.
func tracingCLI(t *testing.T, extraEnv []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	bin := testenv.Binary(t, "./cmd/sluice")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), extraEnv...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("run sluice %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// traceCLI runs `sluice trace args...` against the test's Jaeger.
func traceCLI(t *testing.T, ts *tracingStack, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return tracingCLI(t, []string{"JAEGER_QUERY_URL=" + ts.queryURL, "OTEL_SERVICE_NAME=" + ts.service}, append([]string{"trace"}, args...)...)
}

// attemptLines returns the lines of a waterfall that draw attempts, in order.
func attemptLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "attempt ") && strings.Contains(l, "process ") {
			lines = append(lines, l)
		}
	}
	return lines
}

func TestTracing_AttemptsOfAMessageAreOneTrace(t *testing.T) {
	cases := []struct {
		name         string
		maxRetries   int
		failures     int // attempts that fail before one succeeds; -1: every attempt
		wantOutcomes []string
		wantFailed   []bool
		wantDLQ      bool
	}{
		{
			name: "fails twice then succeeds", maxRetries: 3, failures: 2,
			wantOutcomes: []string{"retry", "retry", "ack"}, wantFailed: []bool{true, true, false},
		},
		{
			name: "exhausts its retries", maxRetries: 2, failures: -1,
			wantOutcomes: []string{"retry", "retry", "dead_letter"}, wantFailed: []bool{true, true, true}, wantDLQ: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := rabbitEnv(t)
			ts := newTracingStack(t, false)
			queue := e.newQueue(t, "test.tracing.attempts")
			var calls atomic.Int32
			start(t, e, router.Config{Telemetry: ts.tel, Retry: tracingRetry(tc.maxRetries)}, func(s *router.Stack) {
				require.NoError(t, s.Handle("attempts", queue, func(m *message.Message) error {
					if n := int(calls.Add(1)); tc.failures < 0 || n <= tc.failures {
						return fmt.Errorf("gateway timeout on attempt %d", n)
					}
					return nil
				}))
			})

			// Published by a traced sluice producer: the trace starts with its send span.
			msg := message.NewMessage("trace-"+testenv.Name("m"), []byte(`{"amount":1}`))
			require.NoError(t, ts.inst.WrapPublisher(e.amqp.Publisher()).Publish(queue, msg))
			traceID := msg.Metadata.Get(headers.TraceParent)[3:35]

			dlq := topology.DLQ(queue)
			tr := ts.awaitTrace(t, msg.UUID, func(spans []jaeger.Span) bool {
				done := countNamed(spans, "process "+queue) == 3 && countNamed(spans, "send sluice.delay") == 2
				if tc.wantDLQ {
					done = done && countNamed(spans, "send "+dlq) == 1
				}
				return done
			})
			assert.Equal(t, traceID, tr.TraceID, "the trace the producer started")
			send := tr.Named("send " + queue)
			require.Len(t, send, 1, "the producer's span")
			assert.Equal(t, []jaeger.Span{send[0]}, tr.Roots(), "one root: the producer's span")

			attempts := byAttempt(tr.Named("process " + queue))
			handoffs := tr.Named("send sluice.delay") // in start order
			require.Len(t, attempts, 3)
			require.Len(t, handoffs, 2)
			parent := send[0].SpanID
			for i, a := range attempts {
				assert.Equal(t, int64(i+1), a.Tags["sluice.attempt"], "attempt %d: sluice.attempt", i+1)
				assert.Equal(t, "consumer", a.Kind(), "attempt %d: span kind", i+1)
				assert.Equal(t, tc.wantOutcomes[i], a.TagString("sluice.outcome"), "attempt %d: outcome", i+1)
				assert.Equal(t, tc.wantFailed[i], a.Failed(), "attempt %d: error status", i+1)
				assert.Equal(t, parent, a.ParentSpanID, "attempt %d: parent (unbroken chain)", i+1)
				if i < len(handoffs) {
					h := handoffs[i]
					assert.Equal(t, "producer", h.Kind(), "hand-off %d: span kind", i+1)
					assert.Equal(t, a.SpanID, h.ParentSpanID, "hand-off %d: parent is attempt %d", i+1, i+1)
					assert.Equal(t, int64(100<<i), h.Tags["sluice.retry.delay_ms"], "hand-off %d: delay", i+1)
					assert.Equal(t, queue, h.TagString("sluice.queue"), "hand-off %d: queue", i+1)
					assert.Equal(t, int64(100<<i), a.Tags["sluice.retry.delay_ms"], "attempt %d: delay", i+1)
					parent = h.SpanID
				}
			}
			for i := range 2 {
				assert.Contains(t, attempts[i].TagString("otel.status_description"), fmt.Sprintf("gateway timeout on attempt %d", i+1))
			}

			last := tr.Spans[len(tr.Spans)-1]
			if tc.wantDLQ {
				dead := tr.Named("send " + dlq)
				require.Len(t, dead, 1)
				assert.Equal(t, attempts[2].SpanID, dead[0].ParentSpanID, "the dead letter is sent by the last attempt")
				assert.Equal(t, dead[0].SpanID, last.SpanID, "the trace ends in the dead-letter publish")
				assert.Empty(t, tr.Children(dead[0].SpanID))
				assert.Equal(t, "producer", dead[0].Kind())
			} else {
				assert.Empty(t, tr.Named("send "+dlq))
				assert.Equal(t, attempts[2].SpanID, last.SpanID, "the trace ends in the successful attempt")
			}

			t.Run("sluice trace draws it", func(t *testing.T) {
				for _, arg := range []string{msg.UUID, tr.TraceID} {
					stdout, stderr, code := traceCLI(t, ts, "--service", ts.service, arg)
					require.Equal(t, 0, code, "sluice trace %s: stderr:\n%s\nstdout:\n%s", arg, stderr, stdout)
					t.Logf("sluice trace %s:\n%s", arg, stdout)
					assert.Contains(t, stdout, tr.TraceID)
					lines := attemptLines(stdout)
					require.Len(t, lines, 3, "one line per attempt:\n%s", stdout)
					for i, l := range lines {
						assert.Contains(t, l, fmt.Sprintf("attempt %d", i+1))
						assert.Equal(t, tc.wantFailed[i], strings.Contains(l, "✗"), "✗ on attempt %d: %q", i+1, l)
						assert.Contains(t, l, tc.wantOutcomes[i], "outcome of attempt %d", i+1)
					}
					assert.Equal(t, 2, strings.Count(stdout, "send sluice.delay"), "the hand-offs:\n%s", stdout)
					assert.Contains(t, stdout, "delay 100ms")
					assert.Contains(t, stdout, "delay 200ms")
					if tc.wantDLQ {
						assert.Contains(t, stdout, "Outcome: ✗ dead_letter")
						assert.Contains(t, stdout, "send "+dlq)
						assert.Contains(t, stdout, "Dead letter: sent to "+dlq)
					} else {
						assert.Contains(t, stdout, "Outcome: ✓ ack")
						assert.NotContains(t, stdout, "Dead letter")
					}
				}
			})
		})
	}
}

func TestTracing_ContextFromAForeignProducer(t *testing.T) {
	const (
		foreignTrace = "0af7651916cd43dd8448eb211c80319c"
		foreignSpan  = "b7ad6b7169203331"
	)
	cases := []struct {
		name        string
		traceparent string
		continued   bool
	}{
		{name: "valid traceparent is continued", traceparent: "00-" + foreignTrace + "-" + foreignSpan + "-01", continued: true},
		{name: "malformed traceparent starts a new trace", traceparent: "00-not-a-trace-context-01"},
		{name: "all-zero trace id starts a new trace", traceparent: "00-00000000000000000000000000000000-" + foreignSpan + "-01"},
	}
	e := rabbitEnv(t)
	ts := newTracingStack(t, false)
	queue := e.newQueue(t, "test.tracing.foreign")
	handled := make(chan string, len(cases))
	start(t, e, router.Config{Telemetry: ts.tel, Retry: tracingRetry(1)}, func(s *router.Stack) {
		require.NoError(t, s.Handle("foreign", queue, func(m *message.Message) error {
			handled <- m.UUID
			return nil
		}))
	})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A plain AMQP client: no Watermill, no sluice, only the W3C header.
			id := testenv.Name("foreign")
			e.rabbit.Publish(queue, amqp091.Publishing{
				MessageId: id,
				Headers:   amqp091.Table{"traceparent": tc.traceparent},
				Body:      []byte(`{"from":"outside"}`),
			})
			select {
			case got := <-handled:
				require.Equal(t, id, got, "the handler processed the message")
			case <-time.After(20 * time.Second):
				t.Fatal("message not processed")
			}

			tr := ts.awaitTrace(t, id, func(spans []jaeger.Span) bool { return countNamed(spans, "process "+queue) == 1 })
			span := tr.Named("process " + queue)[0]
			assert.Equal(t, "ack", span.TagString("sluice.outcome"))
			assert.False(t, span.Failed(), "an invalid traceparent is not an error")
			if tc.continued {
				assert.Equal(t, foreignTrace, tr.TraceID, "the producer's trace continues")
				assert.Equal(t, foreignSpan, span.ParentSpanID, "the first attempt's parent is the producer's span")
			} else {
				assert.NotEqual(t, foreignTrace, tr.TraceID)
				assert.Empty(t, span.ParentSpanID, "a new trace: the attempt is its root")
			}
			require.Eventually(t, func() bool { return e.count(t, queue) == 0 }, 10*time.Second, 20*time.Millisecond, "acked")
			assert.Equal(t, 0, e.count(t, topology.DLQ(queue)), "not dead-lettered")
		})
	}
}

// scrape reads the metrics endpoint.
func scrape(t *testing.T, addr string) (map[string]*dto.MetricFamily, error) {
	t.Helper()
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s: %s", res.Status, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(bytes.NewReader(body))
}

// metricValue sums the samples of family whose labels include want (a histogram counts
// its observations).
func metricValue(families map[string]*dto.MetricFamily, family string, want map[string]string) float64 {
	f, ok := families[family]
	if !ok {
		return 0
	}
	var sum float64
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if labels[k] != v {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		case m.Untyped != nil:
			sum += m.Untyped.GetValue()
		}
	}
	return sum
}

func TestTracing_MetricsOfAKnownRun(t *testing.T) {
	e := rabbitEnv(t)
	ts := newTracingStack(t, true)
	addr := ts.providers.MetricsAddr()
	require.NotEmpty(t, addr, "metrics server address")
	queue := e.newQueue(t, "test.tracing.metrics")
	var retried atomic.Bool
	start(t, e, router.Config{Telemetry: ts.tel, Retry: tracingRetry(3)}, func(s *router.Stack) {
		require.NoError(t, s.Handle("metrics", queue, func(m *message.Message) error {
			switch string(m.Payload) {
			case "retry-once":
				if retried.CompareAndSwap(false, true) {
					return errors.New("gateway timeout")
				}
			case "permanent":
				return sluice.Permanent(errors.New("invalid amount"))
			}
			return nil
		}))
	})

	// 3 successes, 1 retried once then successful, 1 permanent failure: 6 attempts.
	for i, payload := range []string{"ok", "ok", "ok", "retry-once", "permanent"} {
		e.publish(t, queue, message.NewMessage(fmt.Sprintf("metrics-%d", i), []byte(payload)))
	}
	labels := map[string]string{"queue": queue, "handler": "metrics"}
	with := func(k, v string) map[string]string {
		out := map[string]string{k: v}
		for lk, lv := range labels {
			out[lk] = lv
		}
		return out
	}
	var families map[string]*dto.MetricFamily
	var err error
	ok := assert.Eventually(t, func() bool {
		families, err = scrape(t, addr)
		return err == nil && metricValue(families, "sluice_messages_total", labels) == 6 &&
			metricValue(families, "sluice_messages_in_flight", labels) == 0
	}, 20*time.Second, 50*time.Millisecond)
	if !ok {
		t.Fatalf("6 attempts recorded and none in flight: last error %v, sluice_messages_total %v, in flight %v", err,
			metricValue(families, "sluice_messages_total", labels), metricValue(families, "sluice_messages_in_flight", labels))
	}
	for outcome, want := range map[string]float64{"ack": 4, "retry": 1, "dead_letter": 1, "nack": 0, "discard": 0} {
		assert.Equal(t, want, metricValue(families, "sluice_messages_total", with("outcome", outcome)), "sluice_messages_total{outcome=%q}", outcome)
	}
	assert.Equal(t, 1.0, metricValue(families, "sluice_retries_total", labels), "sluice_retries_total")
	assert.Equal(t, 1.0, metricValue(families, "sluice_dead_letters_total", labels), "sluice_dead_letters_total")
	assert.Equal(t, 6.0, metricValue(families, "sluice_handler_duration_seconds", labels), "sluice_handler_duration_seconds count")
	assert.Equal(t, 4.0, metricValue(families, "sluice_handler_duration_seconds", with("outcome", "ack")), "handler duration count of acks")
	assert.Equal(t, 0.0, metricValue(families, "sluice_messages_in_flight", labels), "sluice_messages_in_flight")
	assert.Contains(t, families, "sluice_messages_in_flight", "the in-flight gauge is exported")
	require.Eventually(t, func() bool { return e.count(t, topology.DLQ(queue)) == 1 }, 10*time.Second, 20*time.Millisecond, "one dead letter")
}

func TestTracing_DLQReplayContinuesTheTrace(t *testing.T) {
	e := rabbitEnv(t)
	ts := newTracingStack(t, false)
	queue := e.newQueue(t, "test.tracing.replay")
	dlq := topology.DLQ(queue)
	var calls atomic.Int32
	start(t, e, router.Config{Telemetry: ts.tel, Retry: tracingRetry(1)}, func(s *router.Stack) {
		require.NoError(t, s.Handle("replay", queue, func(m *message.Message) error {
			if calls.Add(1) == 1 {
				return sluice.Permanent(errors.New("invalid amount: -5"))
			}
			return nil // fixed by the time the operator replays
		}))
	})
	msg := message.NewMessage("replay-"+testenv.Name("m"), []byte(`{"amount":-5}`))
	require.NoError(t, ts.inst.WrapPublisher(e.amqp.Publisher()).Publish(queue, msg))
	before := ts.awaitTrace(t, msg.UUID, func(spans []jaeger.Span) bool { return countNamed(spans, "send "+dlq) == 1 })
	require.Eventually(t, func() bool { return e.count(t, dlq) == 1 }, 10*time.Second, 20*time.Millisecond, "dead-lettered")
	dead := before.Named("send " + dlq)[0]

	stdout, stderr, code := tracingCLI(t, []string{"AMQP_URL=" + e.rabbit.URL}, "dlq", "replay", "--queue", queue, "--id", msg.UUID)
	require.Equal(t, 0, code, "sluice dlq replay: stderr:\n%s\nstdout:\n%s", stderr, stdout)

	tr := ts.awaitTrace(t, msg.UUID, func(spans []jaeger.Span) bool { return countNamed(spans, "process "+queue) == 2 })
	assert.Equal(t, before.TraceID, tr.TraceID, "the replay continues the message's trace")
	attempts := tr.Named("process " + queue)
	require.Len(t, attempts, 2)
	assert.Equal(t, "dead_letter", attempts[0].TagString("sluice.outcome"))
	assert.Equal(t, dead.SpanID, attempts[1].ParentSpanID, "the replayed attempt is a child of the dead-letter publish")
	assert.Equal(t, "ack", attempts[1].TagString("sluice.outcome"))
	assert.Equal(t, int64(1), attempts[1].Tags["sluice.attempt"], "a replay starts counting attempts again")
	assert.False(t, attempts[1].Failed())
	require.Eventually(t, func() bool { return e.count(t, queue) == 0 && e.count(t, dlq) == 0 }, 10*time.Second, 20*time.Millisecond)

	stdout, stderr, code = traceCLI(t, ts, msg.UUID)
	require.Equal(t, 0, code, "sluice trace: stderr:\n%s\nstdout:\n%s", stderr, stdout)
	t.Logf("sluice trace %s:\n%s", msg.UUID, stdout)
	lines := attemptLines(stdout)
	require.Len(t, lines, 2, "two attempts:\n%s", stdout)
	assert.Contains(t, lines[0], "✗")
	assert.Contains(t, lines[1], "✓")
	assert.Contains(t, stdout, "Outcome: ✓ ack after 2 attempts")
	var deadLine string
	for _, l := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(l, "Dead letter: ") {
			deadLine = l
		}
	}
	assert.Contains(t, deadLine, "sent to "+dlq+" at ")
	assert.Regexp(t, `by attempt 1, replayed \S+ later$`, deadLine)

	// Against the real Jaeger: an unknown trace id is neither a trace nor a message.
	stdout, stderr, code = traceCLI(t, ts, "00000000000000000000000000000001")
	assert.Equal(t, 3, code, "unknown id: stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stderr, "no trace 00000000000000000000000000000001")
}
