package test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/jaeger"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/router"
)

// In Jaeger, each message of a batch keeps its own trace (producer span, consumer span),
// and the batch call is one span of its own trace linked to every message's consumer span.
func TestTracing_BatchSpanLinksEachMessagesConsumerSpan(t *testing.T) {
	e := rabbitEnv(t)
	ts := newTracingStack(t, false)
	queue := e.newQueue(t, "test.tracing.batch")
	start(t, e, router.Config{Telemetry: ts.tel}, func(s *router.Stack) {
		require.NoError(t, s.HandleBatch("bulk", queue, func(context.Context, []*message.Message) []error { return nil },
			router.WithBatch(3, 5*time.Second)))
	})

	pub := ts.inst.WrapPublisher(e.amqp.Publisher())
	consumers := map[string]string{} // consumer span id -> trace id
	var ids []string
	for range 3 {
		msg := message.NewMessage("batch-"+testenv.Name("m"), []byte(`{"amount":1}`))
		require.NoError(t, pub.Publish(queue, msg))
		ids = append(ids, msg.UUID)
	}
	for _, id := range ids {
		tr := ts.awaitTrace(t, id, func(spans []jaeger.Span) bool { return countNamed(spans, "process "+queue) == 1 })
		spans := tr.Named("process " + queue)
		require.Len(t, spans, 1)
		consumers[spans[0].SpanID] = tr.TraceID
	}
	require.Len(t, consumers, 3)

	var batch []jaeger.Trace
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		batch, err = ts.jaeger.FindTraces(ctx, ts.service, map[string]string{"sluice.handler": "bulk", "messaging.batch.message_count": "3"}, time.Hour)
		return err == nil && len(batch) == 1
	}, 20*time.Second, 100*time.Millisecond)
	spans := batch[0].Named("process batch " + queue)
	require.Len(t, spans, 1, "one batch span")
	span := spans[0]
	assert.Equal(t, "consumer", span.Kind())
	linked := map[string]string{}
	for _, ref := range span.References {
		linked[ref.SpanID] = ref.TraceID
	}
	assert.Equal(t, consumers, linked, "the batch span links each message's consumer span, in its trace")
	for _, tid := range consumers {
		assert.NotEqual(t, batch[0].TraceID, tid, "the batch has a trace of its own")
	}
}
