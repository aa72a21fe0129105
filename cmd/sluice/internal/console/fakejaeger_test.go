package console_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/topology"
)

// fakeJaeger serves Jaeger's query API (/api/services, /api/traces/{id}, /api/traces) with
// one trace: a message of queue that failed three times, retried with delays of 100ms and
// 200ms, and was dead-lettered. Unlike the real Jaeger (TestTimelineFromJaeger), it needs
// nothing running, so the page's drawing can be checked exactly.
type fakeJaeger struct {
	srv     *httptest.Server
	traceID string
	id      string

	// native draws the second retry as RabbitMQ 4.3's native delayed retry does: a
	// rejection ("reject <queue>", a client span) in place of the delay's hand-off.
	native bool

	mu    sync.Mutex
	queue string
}

// setQueue names the queue of the trace's message (known once the fixture exists).
func (f *fakeJaeger) setQueue(q string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queue = q
}

// traceparent is the header naming the fake trace.
func (f *fakeJaeger) traceparent() string { return "00-" + f.traceID + "-00f067aa0ba902b7-01" }

// configure points a console at the fake.
func (f *fakeJaeger) configure(c *console.Config) {
	c.JaegerQueryURL = f.srv.URL
	c.Service = "payments"
}

type kv struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

type ref struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

type wspan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []ref  `json:"references"`
	StartTime     int64  `json:"startTime"`
	Duration      int64  `json:"duration"`
	Tags          []kv   `json:"tags"`
	Logs          []any  `json:"logs"`
	ProcessID     string `json:"processID"`
}

// newFakeJaeger serves the trace of message id (of the queue setQueue names).
func newFakeJaeger(t *testing.T, id string) *fakeJaeger {
	t.Helper()
	f := &fakeJaeger{traceID: "4bf92f3577b34da6a3ce929d0e0e4736", id: id}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/api/services":
			_ = json.NewEncoder(w).Encode(map[string]any{"data": []string{"payments"}})
		case r.URL.Path == "/api/traces/"+f.traceID:
			_ = json.NewEncoder(w).Encode(map[string]any{"data": []any{f.trace()}})
		case strings.HasPrefix(r.URL.Path, "/api/traces"):
			_ = json.NewEncoder(w).Encode(map[string]any{"data": []any{}})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// trace is the wire form of the fake trace.
func (f *fakeJaeger) trace() map[string]any {
	f.mu.Lock()
	queue := f.queue
	f.mu.Unlock()
	id := f.id
	t0 := time.Now().Add(-time.Minute).UnixMicro()
	ms := int64(1000)
	var spans []wspan
	span := func(sid, parent, op, kind string, start, dur int64, tags ...kv) {
		s := wspan{TraceID: f.traceID, SpanID: sid, OperationName: op, StartTime: t0 + start, Duration: dur, Logs: []any{}, ProcessID: "p1",
			Tags: append([]kv{{"span.kind", "string", kind}, {"messaging.message.id", "string", id}}, tags...)}
		if parent != "" {
			s.References = []ref{{"CHILD_OF", f.traceID, parent}}
		}
		spans = append(spans, s)
	}
	dest := func(q string) kv { return kv{"messaging.destination.name", "string", q} }
	failed := kv{"otel.status_code", "string", "ERROR"}
	attempt := func(n int, outcome string, delay int64) []kv {
		tags := []kv{dest(queue), {"sluice.attempt", "int64", n}, {"sluice.outcome", "string", outcome}, failed,
			{"otel.status_description", "string", "gateway: 503 service unavailable"}}
		if delay > 0 {
			tags = append(tags, kv{"sluice.retry.delay_ms", "int64", delay})
		}
		return tags
	}
	span("0000000000000001", "", "send "+queue, "producer", 0, 2*ms, dest(queue))
	span("0000000000000002", "0000000000000001", "process "+queue, "consumer", 3*ms, 4*ms, attempt(1, "retry", 100)...)
	span("0000000000000003", "0000000000000002", "send "+topology.DelayDestination, "producer", 5*ms, ms, dest(topology.DelayDestination), kv{"sluice.retry.delay_ms", "int64", 100})
	span("0000000000000004", "0000000000000003", "process "+queue, "consumer", 108*ms, 3*ms, attempt(2, "retry", 200)...)
	if f.native {
		span("0000000000000005", "0000000000000004", "reject "+queue, "client", 110*ms, ms, dest(queue),
			kv{"messaging.operation.name", "string", "reject"}, kv{"sluice.retry.delay_ms", "int64", 200})
	} else {
		span("0000000000000005", "0000000000000004", "send "+topology.DelayDestination, "producer", 110*ms, ms, dest(topology.DelayDestination), kv{"sluice.retry.delay_ms", "int64", 200})
	}
	span("0000000000000006", "0000000000000005", "process "+queue, "consumer", 316*ms, 3*ms, attempt(3, "dead_letter", 0)...)
	span("0000000000000007", "0000000000000006", "send "+topology.DLQ(queue), "producer", 318*ms, ms, dest(topology.DLQ(queue)), kv{"sluice.last_error", "string", "gateway_down"})
	return map[string]any{"traceID": f.traceID, "spans": spans, "processes": map[string]any{"p1": map[string]any{"serviceName": "payments", "tags": []kv{}}}}
}

// tracedMetadata is the metadata of a dead letter whose trace the fake serves.
func (f *fakeJaeger) tracedMetadata(extra map[string]string) map[string]string {
	md := map[string]string{headers.TraceParent: f.traceparent()}
	for k, v := range extra {
		md[k] = v
	}
	return md
}
