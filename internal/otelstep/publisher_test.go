package otelstep_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/otelstep"
)

func TestWrapPublisher_InjectsTraceContext(t *testing.T) {
	e := newEnv(t)
	inner := &fakePublisher{}
	pub := e.in.WrapPublisher(inner)

	ctx, caller := e.rootSpan("caller")
	msg := message.NewMessage("id-1", []byte("hello"))
	msg.SetContext(ctx)
	// A copy of a consumed message carries the old trace's headers; both must be replaced.
	msg.Metadata.Set(headers.TraceParent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	msg.Metadata.Set(headers.TraceState, "old=state")

	require.NoError(t, pub.Publish("payments", msg))
	caller.End()

	send := e.ended(t, "send payments")
	assert.Equal(t, trace.SpanKindProducer, send.SpanKind())
	assert.Equal(t, caller.SpanContext().SpanID(), send.Parent().SpanID(), "send span is a child of the caller's")
	assert.Equal(t, caller.SpanContext().TraceID(), send.SpanContext().TraceID())
	assert.Equal(t, traceparent(send.SpanContext()), msg.Metadata.Get(headers.TraceParent))
	assert.NotContains(t, msg.Metadata, headers.TraceState, "stale tracestate removed")
	assert.Equal(t, codes.Unset, send.Status().Code)

	a := attrs(send)
	assert.Equal(t, "rabbitmq", a[semconv.MessagingSystemKey].AsString())
	assert.Equal(t, "send", a[semconv.MessagingOperationTypeKey].AsString())
	assert.Equal(t, "send", a[semconv.MessagingOperationNameKey].AsString())
	assert.Equal(t, "payments", a[semconv.MessagingDestinationNameKey].AsString())
	assert.Equal(t, "id-1", a[semconv.MessagingMessageIDKey].AsString())
	assert.Equal(t, int64(5), a[semconv.MessagingMessageBodySizeKey].AsInt64())

	require.Len(t, inner.calls, 1)
	assert.Same(t, msg, inner.calls[0][0])
}

func TestWrapPublisher_Parent(t *testing.T) {
	const remoteTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	const remoteSpan = "00f067aa0ba902b7"
	tests := []struct {
		name        string
		header      string
		wantParent  string // span ID, "" for a root span
		wantTraceID string // "" for a new trace
	}{
		{name: "headers continue the trace when the context has no span",
			header: "00-" + remoteTrace + "-" + remoteSpan + "-01", wantParent: remoteSpan, wantTraceID: remoteTrace},
		{name: "no context span and no headers start a trace"},
		{name: "an invalid traceparent starts a trace", header: "00-not-a-trace-id-01"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			msg := message.NewMessage("id", nil)
			if tt.header != "" {
				msg.Metadata.Set(headers.TraceParent, tt.header)
			}
			require.NoError(t, e.in.WrapPublisher(&fakePublisher{}).Publish("q", msg))

			send := e.ended(t, "send q")
			if tt.wantParent == "" {
				assert.False(t, send.Parent().IsValid(), "root span")
			} else {
				assert.Equal(t, tt.wantParent, send.Parent().SpanID().String())
				assert.True(t, send.Parent().IsRemote())
			}
			if tt.wantTraceID != "" {
				assert.Equal(t, tt.wantTraceID, send.SpanContext().TraceID().String())
			}
			assert.Equal(t, traceparent(send.SpanContext()), msg.Metadata.Get(headers.TraceParent))
		})
	}
}

func TestWrapPublisher_Failure(t *testing.T) {
	e := newEnv(t)
	errBroker := errors.New("broker refused")
	inner := &fakePublisher{err: errBroker}
	msgs := []*message.Message{message.NewMessage("a", nil), message.NewMessage("b", nil)}

	err := e.in.WrapPublisher(inner).Publish("orders", msgs...)

	require.ErrorIs(t, err, errBroker)
	require.Len(t, inner.calls, 1, "one call to the wrapped publisher for the whole batch")
	assert.Len(t, inner.calls[0], 2)
	spans := e.endedAll("send orders")
	require.Len(t, spans, 2, "a span per message")
	for _, s := range spans {
		assert.Equal(t, codes.Error, s.Status().Code)
		assert.Equal(t, "broker refused", s.Status().Description)
		require.NotEmpty(t, s.Events())
		assert.Equal(t, semconv.ExceptionEventName, s.Events()[0].Name)
	}
	assert.NotEqual(t, spans[0].SpanContext().SpanID(), spans[1].SpanContext().SpanID())
}

func TestWrapPublisher_Options(t *testing.T) {
	e := newEnv(t, otelstep.Config{
		MessagingSystem: "memory",
		RoutingKey:      func(destination string, _ *message.Message) string { return "rk." + destination },
	})
	require.NoError(t, e.in.WrapPublisher(&fakePublisher{}).Publish("orders", message.NewMessage("id", nil)))

	a := attrs(e.ended(t, "send orders"))
	assert.Equal(t, "memory", a[semconv.MessagingSystemKey].AsString())
	assert.Equal(t, "rk.orders", a[semconv.MessagingRabbitMQDestinationRoutingKeyKey].AsString())
}
