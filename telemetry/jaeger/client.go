// Package jaeger reads traces from Jaeger's HTTP query API (/api/traces, the JSON API the
// Jaeger UI uses), for the sluice CLI's trace command and for end-to-end tests that
// check what a message's trace looks like.
package jaeger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// DefaultQueryURL is where scripts/jaeger-start.sh serves the query API.
const DefaultQueryURL = "http://127.0.0.1:16686"

// ErrNotFound is returned when Jaeger has no trace with the requested ID.
var ErrNotFound = errors.New("jaeger: trace not found")

// maxResponseBytes bounds what a response may make the client read into memory.
const maxResponseBytes = 64 << 20

// Trace is one trace with its spans ordered by start time.
type Trace struct {
	// TraceID is 32 lower-case hex digits, as trace.TraceID.String() writes it.
	TraceID string
	// Spans are ordered by start time, then span ID.
	Spans []Span
}

// Span is one span as Jaeger stores it. Jaeger turns OpenTelemetry attributes into tags
// and adds its own: span.kind, otel.scope.name, otel.status_code, otel.status_description
// and error.
type Span struct {
	// TraceID is 32 lower-case hex digits, as trace.TraceID.String() writes it.
	TraceID string
	// SpanID is 16 lower-case hex digits.
	SpanID string
	// ParentSpanID is the span ID of the first reference (Jaeger lists the parent first),
	// or "" for a root span.
	ParentSpanID string
	// References link the span to its parent (and, rarely, other spans).
	References []Reference
	// OperationName is the span name, such as "process orders".
	OperationName string
	// StartTime is when the span started, to the microsecond, in UTC.
	StartTime time.Time
	// Duration is the span's length, to the microsecond.
	Duration time.Duration
	// Tags hold string, bool, int64 or float64 values.
	Tags map[string]any
	// Logs are the span's events, such as "exception".
	Logs []Log
	// Service is the service.name of the process that recorded the span.
	Service string
	// ProcessTags are the other resource attributes of that process.
	ProcessTags map[string]any
	// Warnings are Jaeger's remarks about the span (clock skew, missing parent, ...).
	Warnings []string
}

// Reference links a span to another, usually its parent.
type Reference struct {
	// Type is CHILD_OF or FOLLOWS_FROM.
	Type string
	// TraceID is the referenced span's trace, 32 hex digits.
	TraceID string
	// SpanID is the referenced span, 16 hex digits.
	SpanID string
}

// Log is a span event.
type Log struct {
	// Timestamp is when the event happened, to the microsecond, in UTC.
	Timestamp time.Time
	// Fields hold the event's attributes; the event name is under "event".
	Fields map[string]any
}

// Tag returns the value of the tag key.
func (s Span) Tag(key string) (any, bool) {
	v, ok := s.Tags[key]
	return v, ok
}

// TagString returns the tag key formatted as text, or "" if the span has no such tag.
func (s Span) TagString(key string) string {
	v, ok := s.Tags[key]
	if !ok {
		return ""
	}
	if str, ok := v.(string); ok {
		return str
	}
	return fmt.Sprint(v)
}

// Kind returns the span kind Jaeger recorded: "producer", "consumer", "internal", ...
func (s Span) Kind() string { return s.TagString("span.kind") }

// Failed reports whether the span ended with an error status.
func (s Span) Failed() bool {
	return s.TagString("otel.status_code") == "ERROR" || s.TagString("error") == "true"
}

// Span returns the span with the given ID.
func (t Trace) Span(spanID string) (Span, bool) {
	for _, s := range t.Spans {
		if s.SpanID == spanID {
			return s, true
		}
	}
	return Span{}, false
}

// Roots returns the spans whose parent is not in the trace, in start order.
func (t Trace) Roots() []Span {
	var roots []Span
	for _, s := range t.Spans {
		if _, ok := t.Span(s.ParentSpanID); s.ParentSpanID == "" || !ok {
			roots = append(roots, s)
		}
	}
	return roots
}

// Children returns the spans whose parent is spanID, in start order.
func (t Trace) Children(spanID string) []Span {
	var children []Span
	for _, s := range t.Spans {
		if s.ParentSpanID == spanID {
			children = append(children, s)
		}
	}
	return children
}

// Named returns the spans called operationName, in start order.
func (t Trace) Named(operationName string) []Span {
	var spans []Span
	for _, s := range t.Spans {
		if s.OperationName == operationName {
			spans = append(spans, s)
		}
	}
	return spans
}

// Query selects traces in Search. Service is required.
type Query struct {
	// Service is the service.name whose traces are searched.
	Service string
	// Operation, if set, is a span name the trace must contain.
	Operation string
	// Tags must all match on one span of the trace.
	Tags map[string]string
	// Start and End bound the traces' start times; zero values mean Jaeger's defaults
	// (the last two days, up to now).
	Start, End time.Time
	// Limit is the most traces returned; 0 means Jaeger's default (100).
	Limit int
}

// Client queries one Jaeger. The zero value is not usable: BaseURL is required.
type Client struct {
	// BaseURL is the query service's address, such as DefaultQueryURL.
	BaseURL string
	// HTTPClient is the client requests go through; nil means http.DefaultClient.
	HTTPClient *http.Client
}

// GetTrace fetches the trace traceID from the Jaeger at baseURL with http.DefaultClient.
func GetTrace(ctx context.Context, baseURL, traceID string) (Trace, error) {
	return (&Client{BaseURL: baseURL}).GetTrace(ctx, traceID)
}

// FindTraces returns the traces of service that started within lookback of now and have
// a span carrying all of tags, from the Jaeger at baseURL with http.DefaultClient.
func FindTraces(ctx context.Context, baseURL, service string, tags map[string]string, lookback time.Duration) ([]Trace, error) {
	return (&Client{BaseURL: baseURL}).FindTraces(ctx, service, tags, lookback)
}

// GetTrace fetches one trace. A trace Jaeger does not have yields an error wrapping
// ErrNotFound (spans reach Jaeger a moment after they end: poll for a while).
func (c *Client) GetTrace(ctx context.Context, traceID string) (Trace, error) {
	id, err := normalizeID(traceID, 32)
	if err != nil {
		return Trace{}, fmt.Errorf("jaeger: trace ID %q: %w", traceID, err)
	}
	var resp response
	if err := c.get(ctx, "/api/traces/"+id, nil, &resp); err != nil {
		return Trace{}, err
	}
	traces, err := resp.traces()
	if err != nil {
		return Trace{}, err
	}
	for _, t := range traces {
		if t.TraceID == id {
			return t, nil
		}
	}
	return Trace{}, fmt.Errorf("%w: %s", ErrNotFound, id)
}

// FindTraces returns the traces of service that started within lookback of now and have
// a span carrying all of tags, at most 1000.
func (c *Client) FindTraces(ctx context.Context, service string, tags map[string]string, lookback time.Duration) ([]Trace, error) {
	end := time.Now()
	return c.Search(ctx, Query{Service: service, Tags: tags, Start: end.Add(-lookback), End: end, Limit: 1000})
}

// Search returns the traces q selects.
func (c *Client) Search(ctx context.Context, q Query) ([]Trace, error) {
	if q.Service == "" {
		return nil, errors.New("jaeger: search needs a service name")
	}
	params := url.Values{"service": {q.Service}}
	if q.Operation != "" {
		params.Set("operation", q.Operation)
	}
	if len(q.Tags) > 0 {
		b, err := json.Marshal(q.Tags)
		if err != nil {
			return nil, fmt.Errorf("jaeger: encode tags: %w", err)
		}
		params.Set("tags", string(b))
	}
	if !q.Start.IsZero() {
		params.Set("start", strconv.FormatInt(q.Start.UnixMicro(), 10))
	}
	if !q.End.IsZero() {
		params.Set("end", strconv.FormatInt(q.End.UnixMicro(), 10))
	}
	if q.Limit > 0 {
		params.Set("limit", strconv.Itoa(q.Limit))
	}
	var resp response
	if err := c.get(ctx, "/api/traces", params, &resp); err != nil {
		return nil, err
	}
	return resp.traces()
}

// Services lists the services Jaeger has spans of; it doubles as a reachability check.
func (c *Client) Services(ctx context.Context) ([]string, error) {
	var resp struct {
		Data   []string   `json:"data"`
		Errors []apiError `json:"errors"`
	}
	if err := c.get(ctx, "/api/services", nil, &resp); err != nil {
		return nil, err
	}
	if len(resp.Errors) > 0 {
		return nil, fmt.Errorf("jaeger: services: %s", resp.Errors[0])
	}
	sort.Strings(resp.Data)
	return resp.Data, nil
}

func (c *Client) get(ctx context.Context, path string, params url.Values, into any) error {
	if c.BaseURL == "" {
		return errors.New("jaeger: client has no BaseURL")
	}
	u := strings.TrimRight(c.BaseURL, "/") + path
	if len(params) > 0 {
		u += "?" + params.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("jaeger: request %s: %w", u, err)
	}
	req.Header.Set("Accept", "application/json")
	hc := c.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("jaeger: GET %s: %w", u, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxResponseBytes+1))
	if err != nil {
		return fmt.Errorf("jaeger: read response of GET %s: %w", u, err)
	}
	if len(body) > maxResponseBytes {
		return fmt.Errorf("jaeger: response of GET %s exceeds %d bytes", u, maxResponseBytes)
	}
	if res.StatusCode != http.StatusOK {
		var e response
		msg := strings.TrimSpace(string(body))
		if json.Unmarshal(body, &e) == nil && len(e.Errors) > 0 {
			msg = e.Errors[0].String()
		}
		if res.StatusCode == http.StatusNotFound {
			return fmt.Errorf("%w: GET %s: %s", ErrNotFound, u, msg)
		}
		return fmt.Errorf("jaeger: GET %s: %s: %s", u, res.Status, msg)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // int64 tag values beyond 2^53 must not be rounded
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("jaeger: decode response of GET %s: %w", u, err)
	}
	return nil
}

// normalizeID returns id in lower case, left-padded with zeros to n hex digits (Jaeger
// may drop leading zeros).
func normalizeID(id string, n int) (string, error) {
	id = strings.ToLower(strings.TrimSpace(id))
	if id == "" || len(id) > n {
		return "", fmt.Errorf("want 1 to %d hex digits", n)
	}
	for _, r := range id {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return "", fmt.Errorf("want 1 to %d hex digits", n)
		}
	}
	return strings.Repeat("0", n-len(id)) + id, nil
}

// The wire format of /api/traces (Jaeger's UI model).
type response struct {
	Data   []wireTrace `json:"data"`
	Errors []apiError  `json:"errors"`
}

type apiError struct {
	Code    int    `json:"code"`
	Msg     string `json:"msg"`
	TraceID string `json:"traceID"`
}

// String formats the error as Jaeger reported it.
func (e apiError) String() string {
	if e.TraceID != "" {
		return fmt.Sprintf("%d %s (trace %s)", e.Code, e.Msg, e.TraceID)
	}
	return fmt.Sprintf("%d %s", e.Code, e.Msg)
}

type wireTrace struct {
	TraceID   string                 `json:"traceID"`
	Spans     []wireSpan             `json:"spans"`
	Processes map[string]wireProcess `json:"processes"`
}

type wireSpan struct {
	TraceID       string          `json:"traceID"`
	SpanID        string          `json:"spanID"`
	OperationName string          `json:"operationName"`
	References    []wireReference `json:"references"`
	StartTime     int64           `json:"startTime"`
	Duration      int64           `json:"duration"`
	Tags          []wireKV        `json:"tags"`
	Logs          []wireLog       `json:"logs"`
	ProcessID     string          `json:"processID"`
	Warnings      []string        `json:"warnings"`
}

type wireReference struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

type wireKV struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

type wireLog struct {
	Timestamp int64    `json:"timestamp"`
	Fields    []wireKV `json:"fields"`
}

type wireProcess struct {
	ServiceName string   `json:"serviceName"`
	Tags        []wireKV `json:"tags"`
}

// traces converts the response, failing on the errors Jaeger reported with it.
func (r response) traces() ([]Trace, error) {
	if len(r.Errors) > 0 {
		msgs := make([]string, len(r.Errors))
		for i, e := range r.Errors {
			msgs[i] = e.String()
		}
		return nil, fmt.Errorf("jaeger: %s", strings.Join(msgs, "; "))
	}
	traces := make([]Trace, 0, len(r.Data))
	for _, wt := range r.Data {
		t, err := wt.convert()
		if err != nil {
			return nil, err
		}
		traces = append(traces, t)
	}
	return traces, nil
}

func (wt wireTrace) convert() (Trace, error) {
	traceID, err := normalizeID(wt.TraceID, 32)
	if err != nil {
		return Trace{}, fmt.Errorf("jaeger: trace ID %q in response: %w", wt.TraceID, err)
	}
	t := Trace{TraceID: traceID, Spans: make([]Span, 0, len(wt.Spans))}
	for _, ws := range wt.Spans {
		s, err := ws.convert(wt.Processes)
		if err != nil {
			return Trace{}, fmt.Errorf("jaeger: trace %s: %w", traceID, err)
		}
		t.Spans = append(t.Spans, s)
	}
	sort.SliceStable(t.Spans, func(i, j int) bool {
		if !t.Spans[i].StartTime.Equal(t.Spans[j].StartTime) {
			return t.Spans[i].StartTime.Before(t.Spans[j].StartTime)
		}
		return t.Spans[i].SpanID < t.Spans[j].SpanID
	})
	return t, nil
}

func (ws wireSpan) convert(processes map[string]wireProcess) (Span, error) {
	traceID, err := normalizeID(ws.TraceID, 32)
	if err != nil {
		return Span{}, fmt.Errorf("span %q: trace ID %q: %w", ws.SpanID, ws.TraceID, err)
	}
	spanID, err := normalizeID(ws.SpanID, 16)
	if err != nil {
		return Span{}, fmt.Errorf("span ID %q: %w", ws.SpanID, err)
	}
	s := Span{
		TraceID:       traceID,
		SpanID:        spanID,
		OperationName: ws.OperationName,
		StartTime:     time.UnixMicro(ws.StartTime).UTC(),
		Duration:      time.Duration(ws.Duration) * time.Microsecond,
		Tags:          kvs(ws.Tags),
		Warnings:      ws.Warnings,
	}
	for _, ref := range ws.References {
		r := Reference{Type: ref.RefType}
		if r.TraceID, err = normalizeID(ref.TraceID, 32); err != nil {
			return Span{}, fmt.Errorf("span %s: reference trace ID %q: %w", spanID, ref.TraceID, err)
		}
		if r.SpanID, err = normalizeID(ref.SpanID, 16); err != nil {
			return Span{}, fmt.Errorf("span %s: reference span ID %q: %w", spanID, ref.SpanID, err)
		}
		s.References = append(s.References, r)
	}
	if len(s.References) > 0 {
		s.ParentSpanID = s.References[0].SpanID
	}
	for _, wl := range ws.Logs {
		s.Logs = append(s.Logs, Log{Timestamp: time.UnixMicro(wl.Timestamp).UTC(), Fields: kvs(wl.Fields)})
	}
	if p, ok := processes[ws.ProcessID]; ok {
		s.Service = p.ServiceName
		s.ProcessTags = kvs(p.Tags)
	}
	return s, nil
}

// kvs converts Jaeger's typed key-values. A value that does not match its declared type
// is kept as it came, rather than failing a whole trace over one tag.
func kvs(in []wireKV) map[string]any {
	out := make(map[string]any, len(in))
	for _, kv := range in {
		out[kv.Key] = typedValue(kv.Type, kv.Value)
	}
	return out
}

func typedValue(typ string, v any) any {
	text := func() (string, bool) {
		switch x := v.(type) {
		case json.Number:
			return x.String(), true
		case string:
			return x, true
		}
		return "", false
	}
	switch typ {
	case "int64":
		if s, ok := text(); ok {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				return n
			}
		}
	case "float64":
		if s, ok := text(); ok {
			if f, err := strconv.ParseFloat(s, 64); err == nil {
				return f
			}
		}
	case "bool":
		switch x := v.(type) {
		case bool:
			return x
		case string:
			if b, err := strconv.ParseBool(x); err == nil {
				return b
			}
		}
	}
	if n, ok := v.(json.Number); ok {
		return n.String()
	}
	return v
}
