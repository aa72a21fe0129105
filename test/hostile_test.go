package test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	ep "github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
)

// hostileDeliveries is the stack's broker with every delivery counted as the subscriber hands
// it to the stack, by payload (which no hand-off changes) and with the message id it
// carried: attempts that end in any step, not only those reaching the handler.
type hostileDeliveries struct {
	router.Broker

	mu  sync.Mutex
	ids map[[32]byte][]string
}

func (c *hostileDeliveries) Subscriber(opts broker.SubscribeOptions) broker.Subscriber {
	return &hostileSubscriber{Subscriber: c.Broker.Subscriber(opts), c: c}
}

type hostileSubscriber struct {
	broker.Subscriber
	c *hostileDeliveries
}

func (s *hostileSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for m := range in {
			s.c.mu.Lock()
			k := sha256.Sum256(m.Payload)
			s.c.ids[k] = append(s.c.ids[k], m.UUID)
			s.c.mu.Unlock()
			select {
			case out <- m:
			case <-ctx.Done():
				m.Nack() // the stack stopped: back to the broker, as without the counter
			}
		}
	}()
	return out, nil
}

// deliveries returns the ids of the deliveries of the message with payload body.
func (c *hostileDeliveries) deliveries(body []byte) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.ids[sha256.Sum256(body)]...)
}

func (c *hostileDeliveries) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ids := range c.ids {
		n += len(ids)
	}
	return n
}

// hostileOutcome is where a hostile message must end.
type hostileOutcome int

const (
	// toEvent: handled; its Succeeded event is in the output queue.
	toEvent hostileOutcome = iota
	// toDLQ: dead-lettered; its failure record is in the DLQ.
	toDLQ
	// refusedByBroker: RabbitMQ refuses the publish; the message never reaches the queue.
	refusedByBroker
	// absorbed: a duplicate of a processed message, acknowledged without calling the
	// handler (the idempotency step); no second event, no DLQ record.
	absorbed
)

// hostileResult is what became of one case's message.
type hostileResult struct {
	deliveries []string         // the message id each delivery carried
	event      *ep.Succeeded    // toEvent
	eventD     amqp091.Delivery // the event's delivery
	dlq        amqp091.Delivery // toDLQ: the DLQ record as RabbitMQ delivers it
	dlqMsg     *message.Message // the same, as sluice reads it
}

type hostileCase struct {
	name string
	// why documents the expected outcome.
	why string
	pub amqp091.Publishing
	// refusal is the connection error RabbitMQ closes the publisher's connection with
	// (refusedByBroker).
	refusal *amqp091.Error
	// paymentID identifies the case's event (toEvent).
	paymentID string
	want      hostileOutcome
	// deliveries is the exact number of deliveries of the case's payload: retries are
	// bounded. -1: not exact (see the case's check).
	deliveries int
	// errorType is the DLQ record's x-error-type (toDLQ).
	errorType string
	check     func(t *testing.T, res hostileResult)
}

// hostileBody is a valid request; extra fields are appended before the closing brace.
func hostileBody(paymentID, source string, extra ...string) []byte {
	fields := fmt.Sprintf(`{"payment_id":%q,"order_id":"ord-%s","amount_cents":1299,"currency":"EUR","source":%q`, paymentID, paymentID, source)
	for _, e := range extra {
		fields += "," + e
	}
	return []byte(fields + "}")
}

// everyHeaderType holds one header of every field type amqp091 sends and RabbitMQ keeps.
func everyHeaderType() amqp091.Table {
	return amqp091.Table{
		"h-int8":    int8(-8),
		"h-uint8":   uint8(200),
		"h-int16":   int16(-16000),
		"h-uint16":  uint16(60000),
		"h-int32":   int32(-2_000_000_000),
		"h-uint32":  uint32(4_000_000_000),
		"h-int64":   int64(math.MinInt64),
		"h-float32": float32(3.25),
		"h-float64": math.MaxFloat64,
		"h-bool":    true,
		"h-decimal": amqp091.Decimal{Scale: 2, Value: 12345},
		"h-time":    time.Unix(1714557600, 0),
		"h-bytes":   []byte{0, 1, 2, 0xff},
		"h-table":   amqp091.Table{"nested": amqp091.Table{"deep": []any{int8(1), "x", nil}}, "n": int64(7)},
		"h-array":   []any{"a", int16(2), amqp091.Table{"k": "v"}, []any{}, nil},
		"h-void":    nil,
		"h-string":  "plain",
	}
}

// propertyNamedHeaders are headers whose names sluice's marshaler also uses for AMQP
// properties, delivery facts and its own bookkeeping.
func propertyNamedHeaders() amqp091.Table {
	return amqp091.Table{
		amqp.MetadataContentType:     "text/csv",
		amqp.MetadataType:            int32(7),
		amqp.MetadataRoutingKey:      "forged",
		headers.HeaderTypes:          `{"amqp-type":"int8"}`,
		headers.MetadataPrefix + "x": "y",
	}
}

const traceparentRE = `^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`

// hostileMaxRetries is the stack's retry limit: a retryable failure is delivered this many
// times more before the DLQ.
const hostileMaxRetries = 2

// mib is a mebibyte.
const mib = 1 << 20

// TestHostileInput publishes messages no well-behaved producer sends, with a plain
// amqp091-go client, to the real stack around the payment handler, and checks that each
// ends where its case says (a Succeeded event or a DLQ record, or refused by RabbitMQ),
// after a bounded number of attempts, that nothing is lost or looping, and that the
// consumer still handles an ordinary message afterwards.
func TestHostileInput(t *testing.T) {
	s := startHostileStack(t)
	cases := slices.Concat(hostileBodyCases(), hostileHeaderCases(), hostileLimitCases(t), hostileIdentityCases(s))
	for i := range cases {
		c := &cases[i]
		if c.want == refusedByBroker {
			publishRefused(t, s.r.URL, s.queue, c.pub, c.refusal)
			continue
		}
		t.Logf("publishing %q (%d bytes)", c.name, len(c.pub.Body))
		s.r.Publish(s.queue, c.pub)
	}

	got := newHostileOutcomes(s, cases)
	got.waitSettled(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { got.check(t, c) })
	}
	t.Run("an ordinary message afterwards succeeds", got.checkStillWorking)
}

// hostileStack is TestHostileInput's stack: the payment handler behind every step, its
// deliveries counted and its spans recorded.
type hostileStack struct {
	r             *testenv.Rabbit
	queue, output string
	counter       *hostileDeliveries
	spans         *tracetest.SpanRecorder
	gateway       *ep.Gateway
}

func startHostileStack(t *testing.T) *hostileStack {
	r := testenv.NewRabbit(t)
	logger := testLogger()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{r.URL}, Logger: logger})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	counter := &hostileDeliveries{Broker: b, ids: map[[32]byte][]string{}}
	e := &env{name: "rabbitmq", broker: counter, amqp: b, rabbit: r}

	queue := e.newQueue(t, "test.hostile")
	output := queue + ".out"
	r.DeleteQueues(output, topology.DLQ(output))

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	in := &telemetry.Config{TracerProvider: tp, Propagator: propagation.TraceContext{}}
	guard, err := idempotency.New(idempotency.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = guard.Close() })

	cfg := router.Config{
		Logger:      logger,
		Retry:       retry.Config{MaxRetries: hostileMaxRetries, InitialDelay: 50 * time.Millisecond, Jitter: retry.NoJitter},
		Telemetry:   in,
		Guard:       guard,
		Concurrency: 4,
	}
	gateway := ep.NewGateway()
	start(t, e, cfg, func(s *router.Stack) {
		require.NoError(t, s.HandleWithOutput("hostile", queue, output, ep.NewHandler(gateway).Handle, router.WithIdempotencyKey(ep.KeyFunc)))
	})
	return &hostileStack{r: r, queue: queue, output: output, counter: counter, spans: spans, gateway: gateway}
}

// hostileBodyCases are bodies that are not what the handler expects: not JSON, empty, huge,
// or under a content type that says otherwise.
func hostileBodyCases() []hostileCase {
	big := func(paymentID string) []byte {
		head := hostileBody(paymentID, "tok_visa", `"padding":"`)
		body := append(head[:len(head)-1], bytes.Repeat([]byte("x"), 16*mib-len(head)-1)...)
		return append(body, '"', '}')
	}
	garbage := append([]byte("hostile-16mib-garbage:"), bytes.Repeat([]byte{0xff, 'g'}, 8*mib-11)...)
	return []hostileCase{
		{
			name: "invalid JSON", why: "Decode fails: permanent, dead-lettered on the first attempt",
			pub:  amqp091.Publishing{MessageId: "hostile-invalid-json", Body: []byte(`{"payment_id":"hostile-invalid-json",`)},
			want: toDLQ, deliveries: 1, errorType: ep.ErrorTypeDecode,
		},
		{
			name: "empty body", why: "an empty body is not a JSON object: permanent",
			pub:  amqp091.Publishing{MessageId: "hostile-empty"},
			want: toDLQ, deliveries: 1, errorType: ep.ErrorTypeDecode,
		},
		{
			name: "16 MiB valid body", why: "unknown fields are ignored; size alone is no failure",
			pub:       amqp091.Publishing{MessageId: "hostile-16mib-valid", Body: big("hostile-16mib-valid")},
			paymentID: "hostile-16mib-valid", want: toEvent, deliveries: 1,
		},
		{
			name: "16 MiB garbage body", why: "not JSON: permanent; the DLQ record keeps all 16 MiB byte for byte",
			pub:  amqp091.Publishing{MessageId: "hostile-16mib-garbage", Body: garbage},
			want: toDLQ, deliveries: 1, errorType: ep.ErrorTypeDecode,
			check: func(t *testing.T, res hostileResult) {
				assert.Equal(t, len(garbage), len(res.dlq.Body))
				assert.True(t, bytes.Equal(garbage, res.dlq.Body), "payload kept byte for byte")
			},
		},
		{
			name: "wrong content type, valid JSON body", why: "the payment handler decides by the body; the content type is carried, not enforced",
			pub:       amqp091.Publishing{MessageId: "hostile-xml", ContentType: "application/xml", Body: hostileBody("hostile-xml", "tok_visa")},
			paymentID: "hostile-xml", want: toEvent, deliveries: 1,
		},
		{
			name: "wrong content type, refused payment", why: "dead-lettered like any refusal; the record keeps the producer's properties",
			pub: amqp091.Publishing{MessageId: "hostile-text", ContentType: "text/plain", ContentEncoding: "rot13", CorrelationId: "corr-7",
				AppId: "legacy", Priority: 3, Body: hostileBody("hostile-text", paymentsim.TokenInsufficientFunds)},
			want: toDLQ, deliveries: 1, errorType: ep.ErrorTypeInsufficientFunds,
			check: func(t *testing.T, res hostileResult) {
				assert.Equal(t, "text/plain", res.dlq.ContentType)
				assert.Equal(t, "rot13", res.dlq.ContentEncoding)
				assert.Equal(t, "corr-7", res.dlq.CorrelationId)
				assert.Equal(t, "legacy", res.dlq.AppId)
				assert.Equal(t, uint8(3), res.dlq.Priority)
				assert.Equal(t, "hostile-text", res.dlq.MessageId)
			},
		},
	}
}

// hostileHeaderCases are headers of every AMQP type, headers named like the properties, and
// forged retry counts.
func hostileHeaderCases() []hostileCase {
	const maxRetries = hostileMaxRetries // the deliveries of a retried case
	return []hostileCase{
		{
			name: "every AMQP header type", why: "headers never fail a message: the marshaler reads every type",
			pub:       amqp091.Publishing{MessageId: "hostile-types", Headers: everyHeaderType(), Body: hostileBody("hostile-types", "tok_visa")},
			paymentID: "hostile-types", want: toEvent, deliveries: 1,
		},
		{
			name: "every AMQP header type, dead-lettered", why: "the DLQ copy carries each header with the AMQP type the producer gave it",
			pub:  amqp091.Publishing{MessageId: "hostile-types-dlq", Headers: everyHeaderType(), Body: hostileBody("hostile-types-dlq", paymentsim.TokenInsufficientFunds)},
			want: toDLQ, deliveries: 1, errorType: ep.ErrorTypeInsufficientFunds,
			check: func(t *testing.T, res hostileResult) {
				for k, sent := range everyHeaderType() {
					got, ok := res.dlq.Headers[k]
					if !assert.True(t, ok, "header %s kept", k) {
						continue
					}
					assert.IsType(t, sent, got, "header %s keeps its type", k)
					switch sent.(type) {
					case amqp091.Table, []any, float64, time.Time:
					default:
						assert.Equal(t, sent, got, "header %s keeps its value", k)
					}
				}
				assert.Equal(t, time.Unix(1714557600, 0).Unix(), res.dlq.Headers["h-time"].(time.Time).Unix())
			},
		},
		{
			name: "headers named like property keys, retried", why: "a producer's header called content-type (or amqp-*) stays that header on every retry copy and in the DLQ; the properties stay properties",
			pub: amqp091.Publishing{MessageId: "hostile-named-like-props", ContentType: "application/json", Headers: propertyNamedHeaders(),
				Body: hostileBody("hostile-named-like-props", paymentsim.TokenTimeout)},
			want: toDLQ, deliveries: maxRetries + 1, errorType: ep.ErrorTypeGatewayTimeout,
			check: func(t *testing.T, res hostileResult) {
				for k, sent := range propertyNamedHeaders() {
					assert.Equal(t, sent, res.dlq.Headers[k], "header %s kept with its type", k)
				}
				assert.Equal(t, "application/json", res.dlq.ContentType)
				assert.Empty(t, res.dlq.Type, "the amqp-type header did not become the type property")
				assert.Equal(t, "application/json", res.dlqMsg.Metadata.Get(amqp.MetadataContentType))
				assert.Equal(t, "text/csv", res.dlqMsg.Metadata.Get(headers.MetadataPrefix+amqp.MetadataContentType))
			},
		},
		{
			name: "x-retry-count -1 (string)", why: "a negative count reads as 0: the message gets all its retries, then the DLQ",
			pub: amqp091.Publishing{MessageId: "hostile-count-neg", Headers: amqp091.Table{sluice.HeaderRetryCount: "-1"},
				Body: hostileBody("hostile-count-neg", paymentsim.TokenTimeout)},
			want: toDLQ, deliveries: maxRetries + 1, errorType: ep.ErrorTypeGatewayTimeout,
			check: func(t *testing.T, res hostileResult) {
				assert.Equal(t, "2", res.dlq.Headers[sluice.HeaderRetryCount])
			},
		},
		{
			name: "x-retry-count -1 (int64)", why: "as the string; the count keeps the producer's AMQP type on every copy",
			pub: amqp091.Publishing{MessageId: "hostile-count-neg-int", Headers: amqp091.Table{sluice.HeaderRetryCount: int64(-1)},
				Body: hostileBody("hostile-count-neg-int", paymentsim.TokenTimeout)},
			want: toDLQ, deliveries: maxRetries + 1, errorType: ep.ErrorTypeGatewayTimeout,
			check: func(t *testing.T, res hostileResult) {
				assert.Equal(t, int64(2), res.dlq.Headers[sluice.HeaderRetryCount])
			},
		},
		{
			name: `x-retry-count "abc"`, why: "unparseable reads as 0: all retries, then the DLQ",
			pub: amqp091.Publishing{MessageId: "hostile-count-abc", Headers: amqp091.Table{sluice.HeaderRetryCount: "abc"},
				Body: hostileBody("hostile-count-abc", paymentsim.TokenTimeout)},
			want: toDLQ, deliveries: maxRetries + 1, errorType: ep.ErrorTypeGatewayTimeout,
			check: func(t *testing.T, res hostileResult) {
				assert.Equal(t, "2", res.dlq.Headers[sluice.HeaderRetryCount])
			},
		},
		{
			name: "x-retry-count 10^12 (string), failing", why: "a huge count reads as MaxRetryCountHeader: exhausted, DLQ after one attempt",
			pub: amqp091.Publishing{MessageId: "hostile-count-huge", Headers: amqp091.Table{sluice.HeaderRetryCount: "1000000000000"},
				Body: hostileBody("hostile-count-huge", paymentsim.TokenTimeout)},
			want: toDLQ, deliveries: 1, errorType: ep.ErrorTypeGatewayTimeout,
			check: func(t *testing.T, res hostileResult) {
				assert.Equal(t, "1000000", res.dlq.Headers[sluice.HeaderRetryCount])
				assert.Contains(t, res.dlqMsg.Metadata.Get(sluice.HeaderErrorMessage), "retries exhausted")
			},
		},
		{
			name: "x-retry-count 10^12 (int64), failing", why: "as the string; the record's count stays an int64",
			pub: amqp091.Publishing{MessageId: "hostile-count-huge-int", Headers: amqp091.Table{sluice.HeaderRetryCount: int64(1e12)},
				Body: hostileBody("hostile-count-huge-int", paymentsim.TokenTimeout)},
			want: toDLQ, deliveries: 1, errorType: ep.ErrorTypeGatewayTimeout,
			check: func(t *testing.T, res hostileResult) {
				assert.Equal(t, int64(sluice.MaxRetryCountHeader), res.dlq.Headers[sluice.HeaderRetryCount])
			},
		},
		{
			name: "x-retry-count 10^12 (int64), valid request", why: "the count bounds retries, not a first attempt that succeeds",
			pub: amqp091.Publishing{MessageId: "hostile-count-huge-ok", Headers: amqp091.Table{sluice.HeaderRetryCount: int64(1e12)},
				Body: hostileBody("hostile-count-huge-ok", "tok_visa")},
			paymentID: "hostile-count-huge-ok", want: toEvent, deliveries: 1,
			check: func(t *testing.T, res hostileResult) {
				assert.Equal(t, sluice.MaxRetryCountHeader+1, res.event.Attempts)
			},
		},
	}
}

// hostileLimitCases are headers at or past what RabbitMQ accepts: over frame_max, a NaN, a
// forged history, and headers that leave no room for sluice's own.
func hostileLimitCases(t *testing.T) []hostileCase {
	const maxRetries = hostileMaxRetries // the deliveries of a retried case
	// Headers that nearly fill RabbitMQ's default frame_max (131072): accepted on the way
	// in, but every copy sluice publishes adds its own headers.
	const nearFrameMaxPadding = 130_900
	history := make([]failure.HistoryEntry, 1000)
	for i := range history {
		history[i] = failure.HistoryEntry{At: time.Unix(1714557600, 0).UTC(), Attempt: i + 1, Type: "forged", Message: strings.Repeat("m", 50)}
	}
	forgedHistory, err := json.Marshal(history)
	require.NoError(t, err)
	return []hostileCase{
		{
			name: "1 MiB x-retry-history", why: "RabbitMQ refuses a content header over frame_max (131072): it closes the " +
				"publishing connection with 501 FRAME_ERROR and never confirms; the message never reaches the queue",
			pub: amqp091.Publishing{MessageId: "hostile-history-1mib", Headers: amqp091.Table{sluice.HeaderRetryHistory: strings.Repeat("h", mib)},
				Body: hostileBody("hostile-history-1mib", "tok_visa")},
			want: refusedByBroker, refusal: &amqp091.Error{Code: amqp091.FrameError, Reason: "frame_too_large"},
		},
		{
			name: "NaN float header", why: "RabbitMQ cannot parse a NaN (or infinite) float: it closes the publishing connection " +
				"with 541 INTERNAL_ERROR; the message never reaches the queue (and sluice never publishes one: see the marshaler)",
			pub: amqp091.Publishing{MessageId: "hostile-nan", Headers: amqp091.Table{"h-nan": math.NaN()},
				Body: hostileBody("hostile-nan", "tok_visa")},
			want: refusedByBroker, refusal: &amqp091.Error{Code: amqp091.InternalError, Reason: "INTERNAL_ERROR"},
		},
		{
			name: "100 KiB forged x-retry-history", why: "a producer's history is kept apart, bounded like sluice's own " +
				"(the last 5 entries, truncated); the record's history holds only sluice's attempts",
			pub: amqp091.Publishing{MessageId: "hostile-history-forged", Headers: amqp091.Table{sluice.HeaderRetryHistory: string(forgedHistory)},
				Body: hostileBody("hostile-history-forged", paymentsim.TokenTimeout)},
			want: toDLQ, deliveries: maxRetries + 1, errorType: ep.ErrorTypeGatewayTimeout,
			check: func(t *testing.T, res hostileResult) {
				h := res.dlqMsg.Metadata.Get(sluice.HeaderRetryHistory)
				assert.Less(t, len(h), 4096, "bounded history")
				entries := failure.History(res.dlqMsg.Metadata)
				require.Len(t, entries, maxRetries+1)
				for i, e := range entries {
					assert.Equal(t, i+1, e.Attempt, "sluice's own attempts only")
					assert.Equal(t, ep.ErrorTypeGatewayTimeout, e.Type)
				}
				producer := res.dlqMsg.Metadata.Get(headers.ProducerRetryHistory)
				assert.Less(t, len(producer), 4096, "the producer's history is kept bounded")
				kept := failure.History(message.Metadata{sluice.HeaderRetryHistory: producer})
				require.Len(t, kept, failure.MaxHistoryEntries)
				assert.Equal(t, "forged", kept[0].Type)
				assert.Equal(t, 1000, kept[len(kept)-1].Attempt, "the newest forged entries")
			},
		},
		{
			name: "headers just under frame_max, failing", why: "accepted on the way in; the retry and DLQ copies, which add sluice's " +
				"headers, would exceed frame_max, so the marshaler leaves the producer's largest header out and names it in x-dropped-headers",
			pub: amqp091.Publishing{MessageId: "hostile-near-frame-max", Headers: amqp091.Table{"x-producer-padding": strings.Repeat("p", nearFrameMaxPadding)},
				Body: hostileBody("hostile-near-frame-max", paymentsim.TokenTimeout)},
			want: toDLQ, deliveries: maxRetries + 1, errorType: ep.ErrorTypeGatewayTimeout,
			check: func(t *testing.T, res hostileResult) {
				assert.NotContains(t, res.dlq.Headers, "x-producer-padding")
				assert.Equal(t, "x-producer-padding", res.dlq.Headers[headers.Dropped])
				assert.Equal(t, "2", res.dlq.Headers[sluice.HeaderRetryCount])
			},
		},
	}
}

// hostileIdentityCases are broken trace contexts and message ids that are missing or shared.
func hostileIdentityCases(s *hostileStack) []hostileCase {
	spans, gateway := s.spans, s.gateway
	return []hostileCase{
		{
			name: "invalid traceparent", why: "an invalid trace context starts a new trace; it is no error",
			pub: amqp091.Publishing{MessageId: "hostile-traceparent", Headers: amqp091.Table{
				headers.TraceParent: "00-zzzzzzzz-not-a-trace-99", headers.TraceState: "===,,,\x00"},
				Body: hostileBody("hostile-traceparent", "tok_visa")},
			paymentID: "hostile-traceparent", want: toEvent, deliveries: 1,
			check: func(t *testing.T, res hostileResult) {
				tp, _ := res.eventD.Headers[headers.TraceParent].(string)
				assert.Regexp(t, regexp.MustCompile(traceparentRE), tp, "the event carries a valid trace context")
				var found bool
				for _, s := range spans.Ended() {
					for _, a := range s.Attributes() {
						if a.Key == semconv.MessagingMessageIDKey && a.Value.AsString() == "hostile-traceparent" && s.SpanKind() == trace.SpanKindConsumer {
							found = true
							assert.True(t, s.SpanContext().TraceID().IsValid())
							assert.False(t, s.Parent().IsValid(), "a new root, not a child of garbage")
							assert.Contains(t, tp, s.SpanContext().TraceID().String(), "the event continues the new trace")
						}
					}
				}
				assert.True(t, found, "consumer span recorded")
			},
		},
		{
			name: "no message id", why: "the first consume generates an id and the retry copy carries it: the same id on both attempts",
			pub:       amqp091.Publishing{Body: hostileBody("hostile-no-id", paymentsim.FlakyToken(1))},
			paymentID: "hostile-no-id", want: toEvent, deliveries: 2,
			check: func(t *testing.T, res hostileResult) {
				require.Len(t, res.deliveries, 2)
				assert.NotEmpty(t, res.deliveries[0])
				assert.Equal(t, res.deliveries[0], res.deliveries[1])
				assert.Equal(t, 2, res.event.Attempts)
			},
		},
		{
			name: "same message id, payload A", why: "a message id is not an idempotency key: both payments are charged " +
				"(this payload is delivered again by the true duplicate below, which counts its deliveries)",
			pub:       amqp091.Publishing{MessageId: "hostile-same-id", Body: hostileBody("hostile-same-id-a", "tok_visa")},
			paymentID: "hostile-same-id-a", want: toEvent, deliveries: -1,
		},
		{
			name: "same message id, same payload (a true duplicate)", why: "the idempotency step (key: the payment id) acknowledges it " +
				"without calling the handler: the payment is charged once, one event",
			pub:       amqp091.Publishing{MessageId: "hostile-same-id", Body: hostileBody("hostile-same-id-a", "tok_visa")},
			paymentID: "hostile-same-id-a", want: absorbed, deliveries: -1,
			check: func(t *testing.T, res hostileResult) {
				assert.Equal(t, 1, gateway.Attempts("hostile-same-id-a"), "the handler ran once for both copies")
				assert.Equal(t, 1, gateway.ChargeCount("hostile-same-id-a"), "charged once")
				// Two deliveries, or three if the copy came while the original was in
				// flight and was deferred once.
				assert.Contains(t, []int{2, 3}, len(res.deliveries), "deliveries of both copies")
			},
		},
		{
			name: "same message id, payload B", why: "a message id is not an idempotency key: both payments are charged",
			pub:       amqp091.Publishing{MessageId: "hostile-same-id", Body: hostileBody("hostile-same-id-b", "tok_visa")},
			paymentID: "hostile-same-id-b", want: toEvent, deliveries: 1,
		},
	}
}

// hostileOutcomes collects where the hostile messages ended: the Succeeded events by
// payment id and the DLQ records by payload. collect runs in Eventually's goroutine, so it
// records what is wrong (an event read twice, a record dead-lettered twice) in problems,
// which fail the test in its own goroutine right after the wait.
type hostileOutcomes struct {
	s                   *hostileStack
	wantEvents, wantDLQ int
	// settled is the number of deliveries once the hostile messages settled.
	settled int

	mu       sync.Mutex
	events   map[string]hostileResult
	dlq      map[[32]byte]hostileResult
	problems []string
}

func newHostileOutcomes(s *hostileStack, cases []hostileCase) *hostileOutcomes {
	o := &hostileOutcomes{s: s, events: map[string]hostileResult{}, dlq: map[[32]byte]hostileResult{}}
	for _, c := range cases {
		switch c.want {
		case toEvent:
			o.wantEvents++
		case toDLQ:
			o.wantDLQ++
		}
	}
	return o
}

// collect takes every event and DLQ record; it reports whether all came, or something is
// wrong.
func (o *hostileOutcomes) collect() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for {
		d, ok := o.s.r.Get(o.s.output)
		if !ok {
			break
		}
		var ev ep.Succeeded
		if err := json.Unmarshal(d.Body, &ev); err != nil {
			o.problems = append(o.problems, fmt.Sprintf("event %s: %v", d.Body, err))
			continue
		}
		if _, dup := o.events[ev.PaymentID]; dup {
			o.problems = append(o.problems, fmt.Sprintf("payment %s succeeded twice", ev.PaymentID))
			continue
		}
		o.events[ev.PaymentID] = hostileResult{event: &ev, eventD: d}
	}
	for {
		d, ok := o.s.r.Get(topology.DLQ(o.s.queue))
		if !ok {
			break
		}
		m, _ := amqp.Marshaler{}.Unmarshal(d)
		k := sha256.Sum256(d.Body)
		if _, dup := o.dlq[k]; dup {
			o.problems = append(o.problems, fmt.Sprintf("message %s dead-lettered twice", d.MessageId))
			continue
		}
		o.dlq[k] = hostileResult{dlq: d, dlqMsg: m}
	}
	return len(o.problems) > 0 || len(o.events) >= o.wantEvents && len(o.dlq) >= o.wantDLQ
}

// requireSound fails t with what collect found wrong.
func (o *hostileOutcomes) requireSound(t *testing.T) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	require.Empty(t, o.problems)
}

// waitSettled waits until every message ended as an event or a DLQ record and deliveries
// stopped, then checks that nothing is missing or left in the queue.
func (o *hostileOutcomes) waitSettled(t *testing.T) {
	t.Helper()
	require.Eventually(t, o.collect, 120*time.Second, 100*time.Millisecond, "every message ends as an event or a DLQ record")
	o.requireSound(t)
	// Nothing loops: deliveries stop. A duplicate deferred while its original was in flight
	// may still be due (the idempotency step defers for 1s), so wait for a quiet spell
	// longer than that; a loop never gives one, and the exact per-case counts below and
	// the recount at the end catch a slow one.
	settled, quietSince := o.s.counter.total(), time.Now()
	require.Eventually(t, func() bool {
		if n := o.s.counter.total(); n != settled {
			settled, quietSince = n, time.Now()
		}
		return time.Since(quietSince) > 2500*time.Millisecond
	}, 60*time.Second, 100*time.Millisecond, "deliveries stop")
	o.settled = settled
	o.collect()
	o.requireSound(t)
	assert.Len(t, o.events, o.wantEvents, "events")
	assert.Len(t, o.dlq, o.wantDLQ, "DLQ records")
	assert.Equal(t, 0, o.s.r.Count(o.s.queue), "nothing left in the queue")
}

// check checks that c's message ended where c says, after c's number of deliveries.
func (o *hostileOutcomes) check(t *testing.T, c hostileCase) {
	t.Log(c.why)
	res := hostileResult{deliveries: o.s.counter.deliveries(c.pub.Body)}
	switch c.want {
	case toEvent:
		got, ok := o.events[c.paymentID]
		require.True(t, ok, "no event for payment %s", c.paymentID)
		res.event, res.eventD = got.event, got.eventD
	case toDLQ:
		got, ok := o.dlq[sha256.Sum256(c.pub.Body)]
		require.True(t, ok, "no DLQ record")
		res.dlq, res.dlqMsg = got.dlq, got.dlqMsg
		assert.Equal(t, c.errorType, res.dlqMsg.Metadata.Get(sluice.HeaderErrorType), "error type")
		assert.Equal(t, o.s.queue, res.dlqMsg.Metadata.Get(sluice.HeaderOriginalQueue))
		if c.errorType == ep.ErrorTypeDecode {
			// The key function decodes first: the record names it, and no handler.
			assert.Equal(t, "idempotency key function", res.dlqMsg.Metadata.Get(headers.FailedStage))
			assert.NotContains(t, res.dlqMsg.Metadata, headers.Handler)
		} else {
			assert.Equal(t, "hostile", res.dlqMsg.Metadata.Get(headers.Handler))
			assert.NotContains(t, res.dlqMsg.Metadata, headers.FailedStage)
		}
	case refusedByBroker:
		assert.Empty(t, res.deliveries, "never delivered")
	case absorbed:
		_, ok := o.events[c.paymentID]
		require.True(t, ok, "the original's event for payment %s", c.paymentID)
	}
	if c.deliveries >= 0 {
		assert.Len(t, res.deliveries, c.deliveries, "deliveries")
	}
	if c.check != nil {
		c.check(t, res)
	}
}

// checkStillWorking publishes an ordinary message after the hostile ones settled: the
// consumer handles it, with one delivery and no DLQ record.
func (o *hostileOutcomes) checkStillWorking(t *testing.T) {
	o.s.r.Publish(o.s.queue, amqp091.Publishing{MessageId: "after-hostile", Body: hostileBody("after-hostile", "tok_visa")})
	require.Eventually(t, func() bool {
		o.collect()
		o.mu.Lock()
		defer o.mu.Unlock()
		_, ok := o.events["after-hostile"]
		return ok || len(o.problems) > 0
	}, 30*time.Second, 100*time.Millisecond, "an ordinary message after the hostile ones succeeds")
	o.requireSound(t)
	assert.Equal(t, o.settled+1, o.s.counter.total(), "one delivery since the hostile messages settled: the ordinary one")
	assert.Len(t, o.dlq, o.wantDLQ, "no DLQ record since")
}

// publishRefused publishes pub on a connection of its own and checks that RabbitMQ refuses
// it: no confirm, and the connection closed with want's code and a reason containing
// want's. A content header over frame_max is a connection-level protocol error in AMQP
// 0-9-1 (501 FRAME_ERROR); a NaN float crashes RabbitMQ's header parser (541).
func publishRefused(t *testing.T, url, queue string, pub amqp091.Publishing, want *amqp091.Error) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp091.Error, 1))
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, pub)
	if err == nil {
		ok, werr := dc.WaitContext(ctx)
		assert.False(t, ok && werr == nil, "RabbitMQ confirmed a publish it must refuse")
	}
	select {
	case cerr := <-closed:
		require.NotNil(t, cerr)
		assert.Equal(t, want.Code, cerr.Code, "closed with %v", cerr)
		assert.Contains(t, cerr.Reason, want.Reason)
	case <-ctx.Done():
		t.Fatalf("RabbitMQ did not close the connection of a publish it must refuse (%v)", want)
	}
}
