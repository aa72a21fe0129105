package waterfall_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/jaeger"
	"github.com/sluice-go/sluice/internal/waterfall"
)

var update = flag.Bool("update", false, "rewrite the golden files from the current output")

// loadTrace reads testdata/name.json, a response of Jaeger's /api/traces, through the
// jaeger client, so the fixtures stay in the wire format Jaeger really sends.
func loadTrace(t *testing.T, name string) jaeger.Trace {
	t.Helper()
	body, err := os.ReadFile(filepath.Join("testdata", name+".json"))
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	c := &jaeger.Client{BaseURL: srv.URL, HTTPClient: &http.Client{Transport: transport}}
	traces, err := c.Search(context.Background(), jaeger.Query{Service: "any"})
	require.NoError(t, err)
	require.Len(t, traces, 1, "testdata/%s.json holds one trace", name)
	return traces[0]
}

// golden compares got with testdata/name.golden, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./internal/waterfall -update to create it")
	assert.Equal(t, string(want), got, "output differs from %s (-update rewrites it)", path)
}

func render(t *testing.T, tr jaeger.Trace, opts waterfall.Options) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, waterfall.Render(&b, tr, opts))
	return b.String()
}

func TestRender_Golden(t *testing.T) {
	cases := []struct {
		name   string // testdata/<name>.json, compared with testdata/<golden>.golden
		golden string
		opts   waterfall.Options
	}{
		// Recorded from Jaeger by test/tracing_e2e_test.go (names made stable): a message
		// that failed twice, then succeeded.
		{name: "retried", golden: "retried", opts: waterfall.Options{}},
		// A message that failed three times and went to its dead-letter queue.
		{name: "dead_lettered", golden: "dead_lettered", opts: waterfall.Options{}},
		// Recorded from Jaeger by test/nativeretry_test.go on RabbitMQ 4.3.6 (names made
		// stable): a message published untraced, retried twice by its queue's native
		// delayed retry, then acked.
		{name: "native_retried", golden: "native_retried", opts: waterfall.Options{}},
		// A message whose producer outside sluice sent a traceparent.
		{name: "foreign_parent", golden: "foreign_parent", opts: waterfall.Options{}},
		// Dead-lettered, then replayed from the DLQ and processed.
		{name: "replayed", golden: "replayed", opts: waterfall.Options{}},
		// Hand-made: a deferral with a breaker event, a panic, a success that publishes
		// an output consumed by another service.
		{name: "mixed", golden: "mixed", opts: waterfall.Options{}},
		{name: "mixed", golden: "mixed_output_message", opts: waterfall.Options{MessageID: "pay-1005-out"}},
		{name: "retried", golden: "retried_narrow", opts: waterfall.Options{Width: 3}},
		{name: "retried", golden: "retried_wide", opts: waterfall.Options{Width: 80}},
		// Fitted to an 80-column terminal (cmd/payments demo): chains of only children
		// stay at one indentation, details that do not fit go below their row.
		{name: "dead_lettered", golden: "dead_lettered_80", opts: waterfall.Options{LineWidth: 80}},
		{name: "mixed", golden: "mixed_80", opts: waterfall.Options{LineWidth: 80}},
		{name: "replayed", golden: "replayed_60", opts: waterfall.Options{LineWidth: 60}},
	}
	for _, tc := range cases {
		t.Run(tc.golden, func(t *testing.T) {
			tr := loadTrace(t, tc.name)
			got := render(t, tr, tc.opts)
			golden(t, tc.golden, got)
			assert.Equal(t, got, render(t, tr, tc.opts), "rendering is deterministic")
		})
	}
}

func TestRender_Rows(t *testing.T) {
	tr := loadTrace(t, "dead_lettered")
	out := render(t, tr, waterfall.Options{})
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")

	var attempts []string
	for _, l := range lines {
		if strings.Contains(l, "process payments.requested") {
			attempts = append(attempts, l)
		}
	}
	require.Len(t, attempts, 3)
	for i, l := range attempts {
		assert.Contains(t, l, "✗", "attempt %d failed", i+1)
	}

	// Every table row is as wide as the heading up to the bar's end: the columns align.
	var table []string
	for i, l := range lines {
		if strings.HasPrefix(l, "SPAN") {
			table = lines[i:]
			break
		}
	}
	require.NotEmpty(t, table)
	end := func(l string) int { return len([]rune(l[:strings.LastIndex(l, "│")])) }
	for _, l := range table[1:] {
		assert.Equal(t, end(table[0]), end(l), "bar ends in the same column: %q", l)
	}

	// Indentation follows the parent chain: each attempt is deeper than the one before.
	indent := func(l string) int { return len([]rune(l)) - len([]rune(strings.TrimLeft(l, " │├└─┆"))) }
	assert.Less(t, indent(attempts[0]), indent(attempts[1]))
	assert.Less(t, indent(attempts[1]), indent(attempts[2]))
}

func TestRender_Bars(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	span := func(id, parent, name string, at, d time.Duration) jaeger.Span {
		return jaeger.Span{TraceID: "0000000000000000000000000000000a", SpanID: id, ParentSpanID: parent,
			OperationName: name, StartTime: start.Add(at), Duration: d, Tags: map[string]any{}}
	}
	tr := jaeger.Trace{TraceID: "0000000000000000000000000000000a", Spans: []jaeger.Span{
		span("0000000000000001", "", "whole", 0, time.Second),
		span("0000000000000002", "0000000000000001", "first-half", 0, 500*time.Millisecond),
		span("0000000000000003", "0000000000000001", "last-tenth", 900*time.Millisecond, 100*time.Millisecond),
		span("0000000000000004", "0000000000000001", "instant", 500*time.Millisecond, 0),
	}}
	out := render(t, tr, waterfall.Options{Width: 10})
	bars := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		fields := strings.Split(l, "│")
		if len(fields) == 3 {
			name := strings.TrimLeft(strings.Fields(fields[0])[0], "├└─ ")
			if name == "" {
				name = strings.Fields(fields[0])[1]
			}
			bars[name] = fields[1]
		}
	}
	assert.Equal(t, "██████████", bars["whole"])
	assert.Equal(t, "█████     ", bars["first-half"])
	assert.Equal(t, "         █", bars["last-tenth"])
	assert.Equal(t, "     █    ", bars["instant"], "a zero-length span still shows")
}

func TestRender_Degenerate(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		name string
		tr   jaeger.Trace
		want []string
	}{
		{
			name: "no spans",
			tr:   jaeger.Trace{TraceID: "0000000000000000000000000000000b"},
			want: []string{"Trace 0000000000000000000000000000000b has no spans."},
		},
		{
			name: "one span of zero duration",
			tr: jaeger.Trace{TraceID: "0000000000000000000000000000000c", Spans: []jaeger.Span{
				{SpanID: "0000000000000001", OperationName: "lonely", StartTime: start},
			}},
			want: []string{"took 0µs · 1 span", "Outcome: not consumed", "lonely"},
		},
		{
			name: "parent cycle",
			tr: jaeger.Trace{TraceID: "0000000000000000000000000000000d", Spans: []jaeger.Span{
				{SpanID: "0000000000000001", ParentSpanID: "0000000000000002", OperationName: "ping", StartTime: start, Duration: time.Millisecond},
				{SpanID: "0000000000000002", ParentSpanID: "0000000000000001", OperationName: "pong", StartTime: start, Duration: time.Millisecond},
			}},
			want: []string{"ping", "pong"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := render(t, tc.tr, waterfall.Options{})
			for _, w := range tc.want {
				assert.Contains(t, out, w)
			}
		})
	}
}

// With a line width, every line of every fixture fits it, and no row is lost: the table
// has as many rows as when it is drawn one row per line.
func TestRender_LineWidth(t *testing.T) {
	rowsOf := func(out string) int {
		n := 0
		for _, l := range strings.Split(out, "\n") {
			if strings.Count(l, "│") >= 2 && !strings.HasPrefix(l, "SPAN") {
				n++
			}
		}
		return n
	}
	for _, name := range []string{"retried", "dead_lettered", "native_retried", "foreign_parent", "replayed", "mixed"} {
		tr := loadTrace(t, name)
		want := rowsOf(render(t, tr, waterfall.Options{}))
		for _, width := range []int{waterfall.MinLineWidth, 80, 100} {
			t.Run(fmt.Sprintf("%s/%d", name, width), func(t *testing.T) {
				out := render(t, tr, waterfall.Options{LineWidth: width})
				for _, l := range strings.Split(out, "\n") {
					assert.LessOrEqual(t, utf8.RuneCountInString(l), width, "%q", l)
				}
				assert.Equal(t, want, rowsOf(out), "every row is drawn:\n%s", out)
				assert.Contains(t, out, "Outcome: ")
			})
		}
	}
	narrow := render(t, loadTrace(t, "retried"), waterfall.Options{LineWidth: 20})
	for _, l := range strings.Split(narrow, "\n") {
		assert.LessOrEqual(t, utf8.RuneCountInString(l), waterfall.MinLineWidth, "below MinLineWidth means MinLineWidth: %q", l)
	}
}
