package jaeger_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/jaeger"
)

// Recorded from Jaeger v1.76.0 for a trace of the telemetry package's spans: a caller
// span, a "send orders" producer span and a failed "process" consumer span.
const recordedTraceID = "04ab0421713d350467b67a60bf4f94f9"

// serve answers every request with status and the file's contents, and records the
// requests' URLs.
func serve(t *testing.T, status int, file string) (*httptest.Server, *requests) {
	t.Helper()
	body, err := os.ReadFile(file)
	require.NoError(t, err)
	seen := &requests{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.add(r.URL)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv, seen
}

// requests are the URLs a test server was asked for.
type requests struct {
	mu   sync.Mutex
	urls []*url.URL
}

func (r *requests) add(u *url.URL) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.urls = append(r.urls, u)
}

func (r *requests) all() []*url.URL {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*url.URL(nil), r.urls...)
}

func TestGetTrace_RecordedShape(t *testing.T) {
	srv, seen := serve(t, http.StatusOK, "testdata/trace.json")

	tr, err := jaeger.GetTrace(context.Background(), srv.URL+"/", recordedTraceID)
	require.NoError(t, err)

	require.Len(t, seen.all(), 1)
	assert.Equal(t, "/api/traces/"+recordedTraceID, seen.all()[0].Path)
	assert.Equal(t, recordedTraceID, tr.TraceID)
	require.Len(t, tr.Spans, 3)
	assert.Equal(t, []string{"caller", "send orders", "process"},
		[]string{tr.Spans[0].OperationName, tr.Spans[1].OperationName, tr.Spans[2].OperationName}, "in start order")

	caller, send, process := tr.Spans[0], tr.Spans[1], tr.Spans[2]
	assert.Empty(t, caller.ParentSpanID)
	assert.Equal(t, caller.SpanID, send.ParentSpanID)
	assert.Equal(t, send.SpanID, process.ParentSpanID)
	assert.Equal(t, []jaeger.Reference{{Type: "CHILD_OF", TraceID: recordedTraceID, SpanID: send.SpanID}}, process.References)
	assert.Equal(t, []jaeger.Span{caller}, tr.Roots())
	assert.Equal(t, []jaeger.Span{process}, tr.Children(send.SpanID))
	assert.Equal(t, []jaeger.Span{send}, tr.Named("send orders"))

	assert.Equal(t, "a6c77eecb1e305a5", process.SpanID)
	assert.Equal(t, time.UnixMicro(1795981802392403).UTC(), process.StartTime)
	assert.Equal(t, 31*time.Microsecond, process.Duration)
	assert.Equal(t, "sluice-shape-probe", process.Service)
	assert.Equal(t, int64(4242), process.ProcessTags["process.pid"])
	assert.Equal(t, "consumer", process.Kind())
	assert.True(t, process.Failed())
	assert.False(t, send.Failed())
	assert.Equal(t, int64(1), process.Tags["sluice.attempt"])
	assert.Equal(t, "retry", process.TagString("sluice.outcome"))
	assert.Equal(t, "1", process.TagString("sluice.attempt"))
	assert.Empty(t, process.TagString("absent"))
	_, ok := process.Tag("absent")
	assert.False(t, ok)

	require.Len(t, process.Logs, 1)
	assert.Equal(t, "exception", process.Logs[0].Fields["event"])
	assert.Equal(t, "boom", process.Logs[0].Fields["exception.message"])
	assert.Equal(t, time.UnixMicro(1795981802392429).UTC(), process.Logs[0].Timestamp)
}

func TestGetTrace_Errors(t *testing.T) {
	tests := []struct {
		name         string
		status       int
		body         string
		traceID      string
		wantNotFound bool
		wantInErr    string
	}{
		{name: "not found", status: http.StatusNotFound, traceID: recordedTraceID, wantNotFound: true,
			body: `{"data":null,"errors":[{"code":404,"msg":"trace not found"}]}`, wantInErr: "trace not found"},
		{name: "bad request", status: http.StatusBadRequest, traceID: recordedTraceID,
			body: `{"data":null,"errors":[{"code":400,"msg":"bad trace id"}]}`, wantInErr: "400 bad trace id"},
		{name: "server error without JSON", status: http.StatusBadGateway, traceID: recordedTraceID,
			body: `upstream down`, wantInErr: "upstream down"},
		{name: "errors beside a 200", status: http.StatusOK, traceID: recordedTraceID,
			body: `{"data":[],"errors":[{"code":500,"msg":"storage failed","traceID":"ab"}]}`, wantInErr: "storage failed"},
		{name: "another trace returned", status: http.StatusOK, traceID: "ff", wantNotFound: true,
			body: `{"data":[{"traceID":"` + recordedTraceID + `","spans":[]}]}`},
		{name: "not JSON", status: http.StatusOK, traceID: recordedTraceID, body: `<html>`, wantInErr: "decode"},
		{name: "malformed span ID", status: http.StatusOK, traceID: recordedTraceID,
			body:      `{"data":[{"traceID":"` + recordedTraceID + `","spans":[{"traceID":"` + recordedTraceID + `","spanID":"xyz"}]}]}`,
			wantInErr: `"xyz"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			}))
			defer srv.Close()

			_, err := jaeger.GetTrace(context.Background(), srv.URL, tt.traceID)
			require.Error(t, err)
			assert.Equal(t, tt.wantNotFound, errors.Is(err, jaeger.ErrNotFound), err.Error())
			assert.Contains(t, err.Error(), tt.wantInErr)
		})
	}
}

func TestGetTrace_InvalidIDIsNotSent(t *testing.T) {
	srv, seen := serve(t, http.StatusOK, "testdata/trace.json")
	for _, id := range []string{"", "xyz", "../api/services", recordedTraceID + "0"} {
		_, err := jaeger.GetTrace(context.Background(), srv.URL, id)
		assert.Error(t, err, id)
	}
	assert.Empty(t, seen.all())
}

func TestGetTrace_NormalizesIDs(t *testing.T) {
	srv, seen := serve(t, http.StatusOK, "testdata/search.json")

	// Jaeger drops leading zeros of a 64-bit trace ID; callers use the 32-digit form.
	tr, err := jaeger.GetTrace(context.Background(), srv.URL, "0000000000000000A3CE929D0E0E4736")
	require.NoError(t, err)
	assert.Equal(t, "/api/traces/0000000000000000a3ce929d0e0e4736", seen.all()[0].Path)
	assert.Equal(t, "0000000000000000a3ce929d0e0e4736", tr.TraceID)
	send := tr.Named("send orders")[0]
	assert.Equal(t, "00f067aa0ba902b7", send.SpanID)
	assert.Equal(t, tr.TraceID, send.TraceID)
}

func TestSearch(t *testing.T) {
	srv, seen := serve(t, http.StatusOK, "testdata/search.json")
	c := &jaeger.Client{BaseURL: srv.URL, HTTPClient: srv.Client()}
	start := time.UnixMicro(1_700_000_000_000_000)
	end := start.Add(time.Hour)

	traces, err := c.Search(context.Background(), jaeger.Query{
		Service: "payments", Operation: "process orders",
		Tags:  map[string]string{"sluice.outcome": "dead_letter", "messaging.message.id": "m 1"},
		Start: start, End: end, Limit: 7,
	})
	require.NoError(t, err)

	require.Len(t, seen.all(), 1)
	q := seen.all()[0].Query()
	assert.Equal(t, "/api/traces", seen.all()[0].Path)
	assert.Equal(t, "payments", q.Get("service"))
	assert.Equal(t, "process orders", q.Get("operation"))
	assert.Equal(t, "1700000000000000", q.Get("start"))
	assert.Equal(t, "1700003600000000", q.Get("end"))
	assert.Equal(t, "7", q.Get("limit"))
	var tags map[string]string
	require.NoError(t, json.Unmarshal([]byte(q.Get("tags")), &tags))
	assert.Equal(t, map[string]string{"sluice.outcome": "dead_letter", "messaging.message.id": "m 1"}, tags)

	require.Len(t, traces, 1)
	process := traces[0].Named("process orders")[0]
	assert.Equal(t, "00f067aa0ba902b7", process.ParentSpanID, "a FOLLOWS_FROM reference is the parent too")
	assert.Equal(t, "FOLLOWS_FROM", process.References[0].Type)
	assert.Equal(t, int64(9007199254740993), process.Tags["sluice.attempt"], "int64 beyond 2^53 keeps its precision")
	assert.Equal(t, 2.5, process.Tags["sluice.retry.delay_ms"])
	assert.Equal(t, true, process.Tags["error"])
	assert.Equal(t, "not-a-number", process.Tags["odd"], "a mistyped value is kept as it came")
	assert.Equal(t, "AAEC", process.Tags["payload"])
	assert.Equal(t, "consumer", process.Service)
	assert.Equal(t, "producer", traces[0].Named("send orders")[0].Service)
	assert.Equal(t, []string{"clock skew adjusted"}, process.Warnings)
	assert.Equal(t, 1500*time.Microsecond, process.Duration)
}

func TestFindTraces_Lookback(t *testing.T) {
	srv, seen := serve(t, http.StatusOK, "testdata/search.json")
	before := time.Now()

	traces, err := jaeger.FindTraces(context.Background(), srv.URL, "payments", nil, 10*time.Minute)
	require.NoError(t, err)
	assert.Len(t, traces, 1)

	q := seen.all()[0].Query()
	assert.Empty(t, q.Get("tags"), "no tags parameter without tags")
	assert.Equal(t, "1000", q.Get("limit"))
	startMicros, endMicros := parseMicros(t, q.Get("start")), parseMicros(t, q.Get("end"))
	assert.Equal(t, (10 * time.Minute).Microseconds(), endMicros.Sub(startMicros).Microseconds())
	assert.False(t, endMicros.Before(before.Truncate(time.Microsecond)))
}

func parseMicros(t *testing.T, s string) time.Time {
	t.Helper()
	var us int64
	require.NoError(t, json.Unmarshal([]byte(s), &us), s)
	return time.UnixMicro(us)
}

func TestSearch_NeedsService(t *testing.T) {
	_, err := (&jaeger.Client{BaseURL: "http://127.0.0.1:1"}).Search(context.Background(), jaeger.Query{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "service")
}

func TestServices(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/services" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(`{"data":["payments","jaeger","billing"],"total":3}`))
	}))
	defer srv.Close()

	got, err := (&jaeger.Client{BaseURL: srv.URL}).Services(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []string{"billing", "jaeger", "payments"}, got)
}

func TestClient_Unreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.URL
	srv.Close()

	_, err := jaeger.GetTrace(context.Background(), addr, recordedTraceID)
	require.Error(t, err)
	assert.NotErrorIs(t, err, jaeger.ErrNotFound)
	assert.Contains(t, err.Error(), addr)

	_, err = (&jaeger.Client{}).Services(context.Background())
	assert.ErrorContains(t, err, "BaseURL")
}
