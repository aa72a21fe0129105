package jaeger

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

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
