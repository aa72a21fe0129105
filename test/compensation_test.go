package test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
)

// Issue 54, point 1: a handler with a compensation (router.WithCompensation) publishes one
// event built from the message and its failure record when the message's fate is final, to
// an exchange the user names, confirmed with the dead letter before the ack. Over a real
// RabbitMQ connection.

const (
	compensationKey   = "order.cancel"
	compensationTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	compensationSpan  = "00f067aa0ba902b7"
	compensationCorr  = "order-42"
)

// compensationRig is a stack on RabbitMQ whose handler "payments" compensates to an
// exchange of the test's, with a queue the test reads the events from bound to it, and an
// in-process tracer and meter.
type compensationRig struct {
	e               *env
	queue, exchange string
	events          string // the queue bound to exchange with compensationKey
	spans           *tracetest.SpanRecorder
	metrics         *sdkmetric.ManualReader
	calls           atomic.Int64
	stack           *router.Stack
}

// newCompensationRig runs the stack with cfg's retry and handler timeout; fail is the
// handler's error for every message (nil: it hangs until the test ends when hang is set).
func newCompensationRig(t *testing.T, cfg router.Config, fail error, hang bool) *compensationRig {
	t.Helper()
	e := rabbitEnv(t)
	rig := &compensationRig{e: e, queue: e.newQueue(t, "test.comp"), exchange: testenv.Name("test.comp.sagas"),
		spans: tracetest.NewSpanRecorder(), metrics: sdkmetric.NewManualReader()}
	rig.events = rig.exchange + ".events"
	e.rabbit.DeleteQueues(rig.events)
	t.Cleanup(func() { deleteExchange(e.rabbit, rig.exchange) })
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rig.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rig.metrics))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	cfg.Telemetry = &telemetry.Config{TracerProvider: tp, MeterProvider: mp, Propagator: propagation.TraceContext{}}
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	rig.stack = start(t, e, cfg, func(s *router.Stack) {
		require.NoError(t, s.Handle("payments", rig.queue, func(m *message.Message) error {
			rig.calls.Add(1)
			if hang {
				blockIgnoringContext(release)
			}
			return fail
		}, router.WithCompensation(router.Compensation{Exchange: rig.exchange, RoutingKey: compensationKey,
			Build: func(msg, record *message.Message) (*message.Message, error) {
				return message.NewMessage("", []byte(fmt.Sprintf(`{"cancel":%q,"because":%q}`,
					msg.UUID, record.Metadata.Get(sluice.HeaderErrorType)))), nil
			}})))
	})
	// Run declared the exchange; the user's consumer binds its queue to it.
	ch, err := e.rabbit.Conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDeclare(rig.events, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(rig.events, compensationKey, rig.exchange, false, nil))
	return rig
}

// deleteExchange deletes exchange on a connection of its own.
func deleteExchange(r *testenv.Rabbit, exchange string) {
	conn, err := amqp091.Dial(r.URL)
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		_ = ch.ExchangeDelete(exchange, false, false)
		_ = ch.Close()
	}
}

// publish sends a payment with a trace context and a correlation id, as a producer outside
// sluice would.
func (rig *compensationRig) publish(t *testing.T, id string) {
	t.Helper()
	msg := message.NewMessage(id, []byte(`{"order":"42"}`))
	msg.Metadata.Set("traceparent", "00-"+compensationTrace+"-"+compensationSpan+"-01")
	msg.Metadata.Set(headers.CorrelationID, compensationCorr)
	rig.e.publish(t, rig.queue, msg)
}

// take returns the messages in queue, taking them.
func take(t *testing.T, r *testenv.Rabbit, queue string) []*message.Message {
	t.Helper()
	var out []*message.Message
	for {
		d, ok := r.Get(queue)
		if !ok {
			return out
		}
		m, err := amqp.Marshaler{}.Unmarshal(d)
		require.NoError(t, err)
		out = append(out, m)
	}
}

// compensations returns the sluice.compensations points by outcome.
func (rig *compensationRig) compensations(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, rig.metrics.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "sluice.compensations" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				h, _ := dp.Attributes.Value(attribute.Key("handler"))
				o, _ := dp.Attributes.Value(attribute.Key("outcome"))
				out[h.AsString()+"/"+o.AsString()] += dp.Value
			}
		}
	}
	return out
}

// awaitDead waits until n dead letters of the rig's queue were taken, and returns them.
func (rig *compensationRig) awaitDead(t *testing.T, n int) []*message.Message {
	t.Helper()
	var dead []*message.Message
	require.Eventually(t, func() bool {
		dead = append(dead, rig.e.dlq(t, rig.queue)...)
		return len(dead) >= n
	}, 60*time.Second, 50*time.Millisecond, "%d dead letter(s) of %s", n, rig.queue)
	return dead
}

func compensationRetry() router.Config {
	return router.Config{CloseTimeout: 5 * time.Second,
		Retry: retry.Config{MaxRetries: 2, InitialDelay: 50 * time.Millisecond, MaxDelay: 100 * time.Millisecond, Jitter: retry.NoJitter}}
}

// TestCompensation_FinalFailure: MaxRetries 2. A message that always fails is dead-lettered
// after its retries and exactly one event reaches the user's queue, with the deterministic
// id, the correlation id, x-compensation-of, and the message's trace (its producer span a
// child of the last attempt's consumer span); a permanent error compensates at once; a
// discard does not compensate.
func TestCompensation_FinalFailure(t *testing.T) {
	errDeclined := errors.New("card declined")
	tests := []struct {
		name       string
		fail       error
		wantCalls  int64
		wantDead   bool
		wantReason string
	}{
		{name: "retries exhausted", fail: errDeclined, wantCalls: 3, wantDead: true, wantReason: "retries_exhausted"},
		{name: "permanent", fail: sluice.Permanent(errDeclined), wantCalls: 1, wantDead: true, wantReason: "permanent"},
		{name: "discard", fail: sluice.Discard(errDeclined), wantCalls: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rig := newCompensationRig(t, compensationRetry(), tc.fail, false)
			id := "pay-" + testenv.Name("m")
			rig.publish(t, id)
			require.Eventually(t, func() bool { return rig.calls.Load() >= tc.wantCalls }, 30*time.Second, 20*time.Millisecond)
			var dead []*message.Message
			if tc.wantDead {
				dead = rig.awaitDead(t, 1)
			}
			var events []*message.Message
			if tc.wantDead {
				require.Eventually(t, func() bool {
					events = append(events, take(t, rig.e.rabbit, rig.events)...)
					return len(events) >= 1
				}, 30*time.Second, 20*time.Millisecond, "the compensation event arrives")
			}
			// The stack closed, every hand-off is settled: what is there now is all there is.
			require.NoError(t, rig.stack.Close())
			events = append(events, take(t, rig.e.rabbit, rig.events)...)
			dead = append(dead, rig.e.dlq(t, rig.queue)...)
			assert.Zero(t, rig.e.count(t, rig.queue), "the original was acked")
			assert.Equal(t, tc.wantCalls, rig.calls.Load())
			if !tc.wantDead {
				assert.Empty(t, dead, "a discard is not dead-lettered")
				assert.Empty(t, events, "a discard does not compensate")
				assert.Empty(t, rig.compensations(t), "nothing counted")
				return
			}
			require.Len(t, dead, 1)
			require.Len(t, events, 1, "exactly one compensation event")
			rec, ev := dead[0], events[0]
			wantID := carry.CompensationID(message.NewMessage(id, nil))
			assert.Equal(t, tc.wantReason, rec.Metadata.Get("x-dead-letter-reason"))
			assert.Equal(t, wantID, ev.UUID, "derived from the message id")
			assert.Equal(t, wantID, rec.Metadata.Get(headers.CompensationID), "the record names the event")
			assert.Equal(t, "exchange "+rig.exchange+", key "+compensationKey, rec.Metadata.Get(headers.CompensationTo))
			assert.Equal(t, compensationCorr, ev.Metadata.Get(headers.CorrelationID), "the correlation is copied")
			assert.Equal(t, id, ev.Metadata.Get(headers.CompensationOf))
			assert.JSONEq(t, fmt.Sprintf(`{"cancel":%q,"because":"error"}`, id), string(ev.Payload), "built from the message and its record")

			// The event continues the message's trace: its traceparent is its producer span's,
			// a child of the last attempt's consumer span.
			sc := spanContextOf(t, ev.Metadata.Get("traceparent"))
			assert.Equal(t, compensationTrace, sc.TraceID().String(), "the message's trace")
			send := spanByID(rig.spans.Ended(), sc.SpanID())
			require.NotNil(t, send, "the event's producer span was recorded")
			assert.Equal(t, "send "+rig.exchange, send.Name())
			assert.Equal(t, trace.SpanKindProducer, send.SpanKind())
			parent := spanByID(rig.spans.Ended(), send.Parent().SpanID())
			require.NotNil(t, parent, "its parent was recorded")
			assert.Equal(t, trace.SpanKindConsumer, parent.SpanKind(), "the attempt's consumer span")
			assert.Equal(t, sc.TraceID(), spanContextOf(t, rec.Metadata.Get("traceparent")).TraceID(), "the dead letter is in the same trace")

			assert.Equal(t, map[string]int64{"payments/sent": 1}, rig.compensations(t), "sluice.compensations")
		})
	}
}

// TestCompensation_AbandonedNotCompensated: a message whose last attempt was abandoned at
// its handler timeout (the handler hangs, see hung_test.go) may still have its effect: it is
// dead-lettered without a compensation, and its record says why.
func TestCompensation_AbandonedNotCompensated(t *testing.T) {
	cfg := compensationRetry()
	cfg.HandlerTimeout = time.Second
	rig := newCompensationRig(t, cfg, nil, true)
	id := "pay-" + testenv.Name("m")
	rig.publish(t, id)
	dead := rig.awaitDead(t, 1)
	require.Len(t, dead, 1)
	rec := dead[0].Metadata
	assert.Equal(t, "sluice.handler_timeout", rec.Get(sluice.HeaderErrorType))
	assert.Empty(t, rec.Get(headers.CompensationID), "no compensation")
	assert.Contains(t, rec.Get(headers.CompensationError), "withheld: the last attempt was abandoned at its handler timeout and may still be running")
	assert.EqualValues(t, 3, rig.calls.Load(), "its attempt and 2 retries, each abandoned")
	assert.Empty(t, take(t, rig.e.rabbit, rig.events), "no event")
	assert.Equal(t, map[string]int64{"payments/withheld": 1}, rig.compensations(t))
}

// TestCompensation_PublishFails: the compensation's queue is gone, so its publish is
// returned unroutable (mandatory). The original stays unacked and is tried again; once the
// queue is back, the event goes out and the original is acked; no dead letter is lost (each
// try's dead letter was confirmed: the DLQ may hold the same one more than once, all with
// the same compensation id).
func TestCompensation_PublishFails(t *testing.T) {
	e := rabbitEnv(t)
	queue := e.newQueue(t, "test.comp.fails")
	events := queue + ".compensations"
	e.rabbit.DeleteQueues(events)
	var calls atomic.Int64
	s := start(t, e, compensationRetry(), func(s *router.Stack) {
		require.NoError(t, s.Handle("payments", queue, func(*message.Message) error {
			calls.Add(1)
			return sluice.Permanent(errors.New("card declined"))
		}, router.WithCompensation(router.Compensation{Queue: events, Build: func(msg, _ *message.Message) (*message.Message, error) {
			return message.NewMessage("", msg.Payload), nil
		}})))
	})
	ch, err := e.rabbit.Conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDelete(events, false, false, false)
	require.NoError(t, err)

	id := "pay-" + testenv.Name("m")
	e.publish(t, queue, message.NewMessage(id, []byte("x")))
	dead := (&compensationRig{e: e, queue: queue}).awaitDead(t, 2)
	tries := calls.Load()
	assert.GreaterOrEqual(t, tries, int64(2), "the original was given back and tried again")
	assert.Equal(t, -1, e.rabbit.Count(events), "its queue is still gone: no event went")

	_, err = ch.QueueDeclare(events, true, false, false, false, nil)
	require.NoError(t, err)
	var got []*message.Message
	require.Eventually(t, func() bool {
		got = append(got, take(t, e.rabbit, events)...)
		return len(got) >= 1
	}, 60*time.Second, 50*time.Millisecond, "the event goes out once its queue is back")
	require.NoError(t, s.Close())
	got = append(got, take(t, e.rabbit, events)...)
	dead = append(dead, e.dlq(t, queue)...)
	t.Logf("%d tries, %d dead letters, %d event(s)", calls.Load(), len(dead), len(got))
	assert.Zero(t, e.count(t, queue), "the original was acked once both were confirmed")
	wantID := carry.CompensationID(message.NewMessage(id, nil))
	for _, ev := range got {
		assert.Equal(t, wantID, ev.UUID, "every copy of the event has the one id")
	}
	assert.EqualValues(t, len(dead), calls.Load(), "a dead letter per try: none lost")
	for _, d := range dead {
		assert.Equal(t, id, d.UUID)
		assert.Equal(t, wantID, d.Metadata.Get(headers.CompensationID))
	}
}

// TestCompensation_ReplayIsANewFate: an operator replays the dead letter (dlq replay); it
// fails again and its compensation has a new id, derived from the replay count.
func TestCompensation_ReplayIsANewFate(t *testing.T) {
	rig := newCompensationRig(t, compensationRetry(), sluice.Permanent(errors.New("card declined")), false)
	id := "pay-" + testenv.Name("m")
	rig.publish(t, id)
	var events []*message.Message
	require.Eventually(t, func() bool {
		events = append(events, take(t, rig.e.rabbit, rig.events)...)
		return len(events) >= 1 && rig.e.rabbit.Count(topology.DLQ(rig.queue)) == 1
	}, 30*time.Second, 20*time.Millisecond)
	first := events[0].UUID

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The dead letter was compensated: its replay is refused until confirmed.
	op := dlq.Operator{Conn: rig.e.rabbit.Conn}
	_, err := op.Replay(ctx, rig.queue, dlq.Selector{IDs: []string{id}}, dlq.Options{})
	require.ErrorIs(t, err, dlq.ErrCompensated)
	res, err := op.Replay(ctx, rig.queue, dlq.Selector{IDs: []string{id}}, dlq.Options{Compensated: true})
	require.NoError(t, err)
	require.Equal(t, []string{id}, res.IDs)
	require.Eventually(t, func() bool {
		events = append(events, take(t, rig.e.rabbit, rig.events)...)
		return len(events) >= 2
	}, 30*time.Second, 20*time.Millisecond, "the replay's failure compensates again")
	dead := rig.awaitDead(t, 1)
	require.Len(t, dead, 1)
	second := events[1].UUID
	assert.NotEqual(t, first, second, "a replay starts a new fate")
	replayed := message.NewMessage(id, nil)
	replayed.Metadata.Set(headers.ReplayCount, "1")
	assert.Equal(t, carry.CompensationID(replayed), second)
	assert.Equal(t, second, dead[0].Metadata.Get(headers.CompensationID), "the new record names the new event")
	assert.Equal(t, "1", dead[0].Metadata.Get(headers.ReplayCount))
}

// spanContextOf parses a traceparent header.
func spanContextOf(t *testing.T, traceparent string) trace.SpanContext {
	t.Helper()
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
	sc := trace.SpanContextFromContext(ctx)
	require.True(t, sc.IsValid(), "a valid traceparent: %q", traceparent)
	return sc
}

// spanByID returns the span of spans with id, nil when none.
func spanByID(spans []sdktrace.ReadOnlySpan, id trace.SpanID) sdktrace.ReadOnlySpan {
	for _, s := range spans {
		if s.SpanContext().SpanID() == id {
			return s
		}
	}
	return nil
}
