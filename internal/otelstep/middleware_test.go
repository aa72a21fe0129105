package otelstep_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/otelnames"
)

func TestMiddleware_ContinuesProducerTrace(t *testing.T) {
	e := newEnv(t)
	queue := uniqueQueue("orders")
	seen := make(chan trace.SpanContext, 1)
	ps, results := e.runRouter(t, queue, func(msg *message.Message) ([]*message.Message, error) {
		seen <- trace.SpanContextFromContext(msg.Context())
		return nil, nil
	}, routerOpts{})

	ctx, caller := e.rootSpan("caller")
	msg := message.NewMessage("msg-1", []byte(`{"amount":10}`))
	msg.SetContext(ctx)
	require.NoError(t, e.in.WrapPublisher(ps).Publish(queue, msg))
	caller.End()

	r := next(t, results)
	require.NoError(t, r.err)
	send := e.ended(t, "send "+queue)
	process := e.ended(t, "process "+queue)

	assert.Equal(t, trace.SpanKindConsumer, process.SpanKind())
	assert.Equal(t, send.SpanContext().TraceID(), process.SpanContext().TraceID(), "one trace from producer to consumer")
	assert.Equal(t, send.SpanContext().SpanID(), process.Parent().SpanID(), "consumer span is a child of the send span")
	assert.True(t, process.Parent().IsRemote())
	assert.Equal(t, process.SpanContext(), <-seen, "the handler's message context carries the consumer span")
	assert.Equal(t, process.SpanContext(), trace.SpanContextFromContext(r.msg.Context()))
	assert.Equal(t, codes.Unset, process.Status().Code)

	a := attrs(process)
	assert.Equal(t, "rabbitmq", a[semconv.MessagingSystemKey].AsString())
	assert.Equal(t, "process", a[semconv.MessagingOperationTypeKey].AsString())
	assert.Equal(t, "process", a[semconv.MessagingOperationNameKey].AsString())
	assert.Equal(t, queue, a[semconv.MessagingDestinationNameKey].AsString())
	assert.Equal(t, "msg-1", a[semconv.MessagingMessageIDKey].AsString())
	assert.Equal(t, int64(len(`{"amount":10}`)), a[semconv.MessagingMessageBodySizeKey].AsInt64())
	assert.Equal(t, "test-handler", a[otelnames.AttrHandler].AsString())
	assert.Equal(t, int64(1), a[otelnames.AttrAttempt].AsInt64())
	assert.Equal(t, "ack", a[otelnames.AttrOutcome].AsString())
}

func TestMiddleware_InvalidTraceContextStartsTrace(t *testing.T) {
	tests := []struct {
		name    string
		headers map[string]string
	}{
		{name: "no trace headers"},
		{name: "garbage traceparent", headers: map[string]string{headers.TraceParent: "garbage"}},
		{name: "all-zero trace id", headers: map[string]string{
			headers.TraceParent: "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}},
		{name: "forbidden version ff", headers: map[string]string{
			headers.TraceParent: "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
		{name: "tracestate without traceparent", headers: map[string]string{headers.TraceState: "k=v"}},
		{name: "oversized traceparent", headers: map[string]string{
			headers.TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" + string(make([]byte, 4096))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			queue := uniqueQueue("invalid")
			ps, results := e.runRouter(t, queue, func(*message.Message) ([]*message.Message, error) {
				return nil, nil
			}, routerOpts{})

			msg := message.NewMessage("id", nil)
			for k, v := range tt.headers {
				msg.Metadata.Set(k, v)
			}
			require.NoError(t, ps.Publish(queue, msg))

			r := next(t, results)
			require.NoError(t, r.err, "a bad trace header is not the handler's error")
			process := e.ended(t, "process "+queue)
			assert.False(t, process.Parent().IsValid(), "a new root span")
			assert.True(t, process.SpanContext().TraceID().IsValid())
			assert.Equal(t, codes.Unset, process.Status().Code)
			assert.Equal(t, "ack", attrs(process)[otelnames.AttrOutcome].AsString())
		})
	}
}

func TestMiddleware_IgnoresSubscriberContextSpan(t *testing.T) {
	e := newEnv(t)
	queue := uniqueQueue("preserve")
	// PreserveContext hands the publisher's context to the consumer: its span belongs to
	// whoever called Publish, and a message without trace headers must not join it.
	ps, results := e.runRouter(t, queue, func(*message.Message) ([]*message.Message, error) {
		return nil, nil
	}, routerOpts{preserveContext: true})

	ctx, outer := e.rootSpan("outer")
	msg := message.NewMessage("id", nil)
	msg.SetContext(ctx)
	require.NoError(t, ps.Publish(queue, msg))
	next(t, results)
	outer.End()

	process := e.ended(t, "process "+queue)
	assert.False(t, process.Parent().IsValid())
	assert.NotEqual(t, outer.SpanContext().TraceID(), process.SpanContext().TraceID())
}

func TestMiddleware_Outcomes(t *testing.T) {
	errBoom := errors.New("gateway timeout")
	tests := []struct {
		name         string
		retryCount   string
		report       *testReport
		handlerErr   error
		wantOutcome  string
		wantAttempt  int64
		wantDelayMS  int64 // 0: attribute absent
		wantError    bool  // error status and an exception event
		wantEvent    bool  // an exception event without error status
		wantErrType  string
		wantDeferWhy string
	}{
		{name: "nil error, nothing reported", wantOutcome: "ack", wantAttempt: 1},
		{name: "error, nothing reported", handlerErr: errBoom,
			wantOutcome: "nack", wantAttempt: 1, wantError: true, wantErrType: sluice.ErrorType(errBoom)},
		{name: "retry reported", retryCount: "2",
			report:      &testReport{Outcome: disposition.Retry, Delay: 1500 * time.Millisecond, Err: errBoom},
			wantOutcome: "retry", wantAttempt: 3, wantDelayMS: 1500, wantError: true},
		{name: "retry reported without an error", report: &testReport{Outcome: disposition.Retry, Delay: time.Second},
			wantOutcome: "retry", wantAttempt: 1, wantDelayMS: 1000, wantError: true},
		{name: "dead letter reported", retryCount: "4",
			report:      &testReport{Outcome: disposition.DeadLetter, Err: sluice.Permanent(typedErr{})},
			wantOutcome: "dead_letter", wantAttempt: 5, wantError: true, wantErrType: "insufficient_funds"},
		{name: "nack reported with the hand-off error", handlerErr: errBoom,
			report:      &testReport{Outcome: disposition.GiveBack, Err: errBoom},
			wantOutcome: "nack", wantAttempt: 1, wantError: true},
		{name: "discard keeps the error without failing", report: &testReport{Outcome: disposition.Discard, Err: sluice.Discard(errBoom)},
			wantOutcome: "discard", wantAttempt: 1, wantEvent: true},
		{name: "duplicate", report: &testReport{Outcome: disposition.Duplicate},
			wantOutcome: "duplicate", wantAttempt: 1},
		{name: "deferred is not a failure", retryCount: "1",
			report:      &testReport{Outcome: disposition.Defer, Delay: 5 * time.Second, Err: errors.New("breaker open")},
			wantOutcome: "deferred", wantAttempt: 2, wantDelayMS: 5000, wantDeferWhy: "breaker open"},
		{name: "unparseable retry count is the first attempt", retryCount: "many",
			wantOutcome: "ack", wantAttempt: 1},
		{name: "huge retry count is capped", retryCount: "99999999999999999999999",
			wantOutcome: "ack", wantAttempt: sluice.MaxRetryCountHeader + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			queue := uniqueQueue("outcomes")
			ps, results := e.runRouter(t, queue, func(msg *message.Message) ([]*message.Message, error) {
				if tt.report != nil {
					reportTo(e.in, msg.Context(), *tt.report)
				}
				return nil, tt.handlerErr
			}, routerOpts{})

			msg := message.NewMessage("id", nil)
			if tt.retryCount != "" {
				msg.Metadata.Set(sluice.HeaderRetryCount, tt.retryCount)
			}
			require.NoError(t, ps.Publish(queue, msg))
			r := next(t, results)
			assert.ErrorIs(t, r.err, tt.handlerErr, "the middleware returns the handler's error unchanged")

			process := e.ended(t, "process "+queue)
			a := attrs(process)
			assert.Equal(t, tt.wantOutcome, a[otelnames.AttrOutcome].AsString())
			assert.Equal(t, tt.wantAttempt, a[otelnames.AttrAttempt].AsInt64())
			if tt.wantDelayMS == 0 {
				assert.NotContains(t, a, otelnames.AttrRetryDelayMS)
			} else {
				assert.Equal(t, tt.wantDelayMS, a[otelnames.AttrRetryDelayMS].AsInt64())
			}
			if tt.wantDeferWhy != "" {
				assert.Equal(t, tt.wantDeferWhy, a[otelnames.AttrDeferReason].AsString())
			}
			if tt.wantError {
				assert.Equal(t, codes.Error, process.Status().Code)
				assert.NotEmpty(t, process.Status().Description)
			} else {
				assert.Equal(t, codes.Unset, process.Status().Code)
			}
			if tt.wantError || tt.wantEvent {
				require.Len(t, process.Events(), 1)
				assert.Equal(t, semconv.ExceptionEventName, process.Events()[0].Name)
			} else {
				assert.Empty(t, process.Events())
			}
			if tt.wantErrType != "" {
				assert.Equal(t, tt.wantErrType, a[semconv.ErrorTypeKey].AsString())
			}
		})
	}
}

// typedErr names its own type, as a handler's business errors do.
type typedErr struct{}

func (typedErr) Error() string     { return "insufficient funds" }
func (typedErr) ErrorType() string { return "insufficient_funds" }

func TestMiddleware_OutsideRouter(t *testing.T) {
	e := newEnv(t)
	out := message.NewMessage("out", nil)
	var inner context.Context
	h := e.in.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		inner = msg.Context()
		return []*message.Message{out}, nil
	})

	outs, err := h(message.NewMessage("in", nil))
	require.NoError(t, err)
	require.Len(t, outs, 1)

	process := e.ended(t, "process")
	assert.NotContains(t, attrs(process), semconv.MessagingDestinationNameKey, "no queue known")
	assert.NotContains(t, attrs(process), otelnames.AttrHandler)
	assert.Equal(t, process.SpanContext(), trace.SpanContextFromContext(inner))
	assert.Equal(t, process.SpanContext(), trace.SpanContextFromContext(out.Context()),
		"an output without a span continues the consumer's trace")
}

func TestMiddleware_OutputKeepsItsOwnSpan(t *testing.T) {
	e := newEnv(t)
	ctx, own := e.rootSpan("own")
	own.End()
	out := message.NewMessage("out", nil)
	out.SetContext(ctx)
	h := e.in.Middleware(func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{out}, nil
	})

	_, err := h(message.NewMessage("in", nil))
	require.NoError(t, err)
	assert.Equal(t, own.SpanContext(), trace.SpanContextFromContext(out.Context()))
}

func TestMiddleware_PanicEndsSpan(t *testing.T) {
	e := newEnv(t)
	h := e.in.Middleware(func(*message.Message) ([]*message.Message, error) {
		panic("handler bug")
	})

	require.PanicsWithValue(t, "handler bug", func() { _, _ = h(message.NewMessage("id", nil)) })

	process := e.ended(t, "process")
	assert.Equal(t, codes.Error, process.Status().Code)
	assert.Equal(t, "nack", attrs(process)[otelnames.AttrOutcome].AsString())
	m := e.collect(t)
	assert.Equal(t, int64(0), sumPoint(t, m[otelnames.MetricInFlight]), "in-flight released")
	assert.Equal(t, int64(1), sumPoint(t, m[otelnames.MetricMessages], otelnames.MetricAttrOutcome.String("nack")))
}

// spanTree renders the parent links of spans for failure messages.
func spanTree(spans []sdktrace.ReadOnlySpan) string {
	s := ""
	for _, sp := range spans {
		s += fmt.Sprintf("%s %s parent=%s\n", sp.Name(), sp.SpanContext().SpanID(), sp.Parent().SpanID())
	}
	return s
}

// Issue 17: a panic's whole stack was the span's status and exception message. The span
// says "panic: <value>"; the stack is the exception's stacktrace.
func TestMiddleware_PanicSpanNamesItsValue(t *testing.T) {
	e := newEnv(t)
	queue := uniqueQueue("panic")
	ps, results := e.runRouter(t, queue, middleware.Recoverer(func(*message.Message) ([]*message.Message, error) {
		panic("card store is nil")
	}), routerOpts{})
	require.NoError(t, ps.Publish(queue, message.NewMessage("id", nil)))
	r := next(t, results)
	require.Error(t, r.err)

	process := e.ended(t, "process "+queue)
	assert.Equal(t, "panic: card store is nil", process.Status().Description)
	require.Len(t, process.Events(), 1)
	ev := map[attribute.Key]attribute.Value{}
	for _, kv := range process.Events()[0].Attributes {
		ev[kv.Key] = kv.Value
	}
	assert.Equal(t, "panic: card store is nil", ev[semconv.ExceptionMessageKey].AsString())
	assert.Contains(t, ev[semconv.ExceptionStacktraceKey].AsString(), "goroutine")
	assert.Equal(t, "panic", attrs(process)[semconv.ErrorTypeKey].AsString())
}
