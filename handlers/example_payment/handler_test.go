package example_payment_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sluice "github.com/sluice-go/sluice"
	ep "github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/internal/topology"
)

// Handle must be usable as a plain watermill handler.
var _ message.HandlerFunc = ep.NewHandler(ep.NewGateway()).Handle

// newMessage returns a request message as the stack would deliver it on the given attempt
// (counting from 1): with x-retry-count attempt-1, or no header on the first attempt.
func newMessage(t *testing.T, body []byte, attempt int) *message.Message {
	t.Helper()
	msg := message.NewMessage(watermill.NewUUID(), body)
	if attempt > 1 {
		msg.Metadata.Set(sluice.HeaderRetryCount, strconv.Itoa(attempt-1))
	}
	return msg
}

func requestBody(t *testing.T, paymentID, source string) []byte {
	t.Helper()
	b, err := json.Marshal(request(paymentID, source))
	require.NoError(t, err)
	return b
}

// succeeded checks that out is exactly one well-formed Succeeded event and returns it.
func succeeded(t *testing.T, out []*message.Message) ep.Succeeded {
	t.Helper()
	require.Len(t, out, 1)
	assert.NotEmpty(t, out[0].UUID)
	assert.Equal(t, paymentsim.ContentTypeJSON, out[0].Metadata.Get("content-type"))
	var ev ep.Succeeded
	require.NoError(t, json.Unmarshal(out[0].Payload, &ev))
	return ev
}

func TestHandler_HandleByToken(t *testing.T) {
	tests := []struct {
		source string
		// steps are consecutive deliveries of one message: "" succeeds, else the error type.
		steps []string
	}{
		{source: "tok_visa", steps: []string{""}},
		{source: paymentsim.TokenInsufficientFunds, steps: []string{ep.ErrorTypeInsufficientFunds}},
		{source: paymentsim.FlakyToken(1), steps: []string{ep.ErrorTypeGatewayTimeout, ""}},
		{source: paymentsim.FlakyToken(3), steps: []string{ep.ErrorTypeGatewayTimeout, ep.ErrorTypeGatewayTimeout, ep.ErrorTypeGatewayTimeout, ""}},
		{source: paymentsim.FlakyToken(9), steps: []string{
			ep.ErrorTypeGatewayTimeout, ep.ErrorTypeGatewayTimeout, ep.ErrorTypeGatewayTimeout,
			ep.ErrorTypeGatewayTimeout, ep.ErrorTypeGatewayTimeout, ep.ErrorTypeGatewayTimeout,
			ep.ErrorTypeGatewayTimeout, ep.ErrorTypeGatewayTimeout, ep.ErrorTypeGatewayTimeout, ""}},
		{source: paymentsim.TokenTimeout, steps: []string{ep.ErrorTypeGatewayTimeout, ep.ErrorTypeGatewayTimeout, ep.ErrorTypeGatewayTimeout, ep.ErrorTypeGatewayTimeout, ep.ErrorTypeGatewayTimeout}},
		{source: paymentsim.TokenRateLimited, steps: []string{paymentsim.ErrorTypeRateLimited, ""}},
	}
	for _, tt := range tests {
		t.Run(tt.source, func(t *testing.T) {
			g := ep.NewGateway()
			h := ep.NewHandler(g)
			body := requestBody(t, "pay_1", tt.source)
			for i, wantErrType := range tt.steps {
				attempt := i + 1
				out, err := h.Handle(newMessage(t, body, attempt))
				if wantErrType != "" {
					require.Error(t, err, "attempt %d", attempt)
					assert.Nil(t, out)
					assert.Equal(t, wantErrType, sluice.ErrorType(err), "attempt %d: %v", attempt, err)
					assert.Equal(t, wantErrType == ep.ErrorTypeInsufficientFunds, sluice.ClassOf(err) == sluice.ClassPermanent, "only a decline is permanent: %v", err)
					continue
				}
				require.NoError(t, err, "attempt %d", attempt)
				ev := succeeded(t, out)
				assert.Equal(t, ep.Succeeded{
					PaymentID:   "pay_1",
					OrderID:     "ord_pay_1",
					AmountCents: 1299,
					Currency:    "EUR",
					ChargeID:    "ch_00000001",
					Attempts:    attempt,
				}, ev)
			}
			wantCharges := 0
			if tt.steps[len(tt.steps)-1] == "" {
				wantCharges = 1
			}
			assert.Equal(t, wantCharges, g.ChargeCount("pay_1"))
			assert.Equal(t, len(tt.steps), g.Attempts("pay_1"))
		})
	}
}

func TestHandler_AttemptsFromRetryCount(t *testing.T) {
	tests := []struct {
		name   string
		header *string // nil: no header
		want   int
	}{
		{name: "no header is the first attempt", header: nil, want: 1},
		{name: "0", header: ptr("0"), want: 1},
		{name: "1", header: ptr("1"), want: 2},
		{name: "7", header: ptr("7"), want: 8},
		{name: "garbage counts as 0", header: ptr("many"), want: 1},
		{name: "negative counts as 0", header: ptr("-3"), want: 1},
		{name: "huge is capped", header: ptr("99999999999999999999"), want: sluice.MaxRetryCountHeader + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := ep.NewHandler(ep.NewGateway())
			msg := message.NewMessage(watermill.NewUUID(), requestBody(t, "pay_1", "tok_visa"))
			if tt.header != nil {
				msg.Metadata.Set(sluice.HeaderRetryCount, *tt.header)
			}
			out, err := h.Handle(msg)
			require.NoError(t, err)
			assert.Equal(t, tt.want, succeeded(t, out).Attempts)
		})
	}
}

func ptr(s string) *string { return &s }

func TestHandler_AttemptsFollowHeaderNotGateway(t *testing.T) {
	// The gateway counts its own attempts for tok_flaky_N; the event reports the delivery
	// attempt the stack says this is, which is what a trace and a failure record show.
	g := ep.NewGateway()
	h := ep.NewHandler(g)
	body := requestBody(t, "pay_1", paymentsim.FlakyToken(1))
	_, err := h.Handle(newMessage(t, body, 1))
	require.Error(t, err)
	out, err := h.Handle(newMessage(t, body, 5))
	require.NoError(t, err)
	assert.Equal(t, 5, succeeded(t, out).Attempts)
	assert.Equal(t, 2, g.Attempts("pay_1"))
}

func TestHandler_RateLimitedReturnsRetryAfter2s(t *testing.T) {
	h := ep.NewHandler(ep.NewGateway())
	_, err := h.Handle(newMessage(t, requestBody(t, "pay_rl", paymentsim.TokenRateLimited), 1))
	require.Error(t, err)
	assert.Equal(t, sluice.ClassRetryable, sluice.ClassOf(err))
	var ra *markers.RetryAfter
	require.ErrorAs(t, err, &ra)
	assert.Equal(t, 2*time.Second, ra.After)
	assert.Equal(t, paymentsim.ErrorTypeRateLimited, sluice.ErrorType(err))
}

func TestHandler_PanicTokenPanicsEveryAttempt(t *testing.T) {
	g := ep.NewGateway()
	h := ep.NewHandler(g)
	body := requestBody(t, "pay_p", paymentsim.TokenPanic)
	for attempt := 1; attempt <= 3; attempt++ {
		assert.PanicsWithValue(t,
			`example_payment: simulated gateway client crash charging payment "pay_p" (source tok_panic, attempt `+strconv.Itoa(attempt)+`)`,
			func() { _, _ = h.Handle(newMessage(t, body, attempt)) })
	}
	assert.Equal(t, 0, g.TotalCharges())
}

func TestHandler_InvalidRequestIsPermanentAndNotCharged(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		wantType string
	}{
		{name: "not JSON", body: "{", wantType: ep.ErrorTypeDecode},
		{name: "bad currency", body: `{"payment_id":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"eur","source":"tok_visa"}`, wantType: ep.ErrorTypeValidation},
		{name: "amount as string", body: `{"payment_id":"pay_1","order_id":"ord_1","amount_cents":"12.99","currency":"EUR","source":"tok_visa"}`, wantType: ep.ErrorTypeValidation},
		{name: "panic token never reaches the gateway when invalid", body: `{"payment_id":"pay_1","order_id":"ord_1","amount_cents":0,"currency":"EUR","source":"tok_panic"}`, wantType: ep.ErrorTypeValidation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := ep.NewGateway()
			h := ep.NewHandler(g)
			out, err := h.Handle(newMessage(t, []byte(tt.body), 1))
			require.Error(t, err)
			assert.Nil(t, out)
			assert.Equal(t, sluice.ClassPermanent, sluice.ClassOf(err))
			assert.Equal(t, tt.wantType, sluice.ErrorType(err))
			assert.Equal(t, 0, g.Attempts("pay_1"))
			assert.Equal(t, 0, g.TotalCharges())
		})
	}
}

func TestHandler_UsesMessageContext(t *testing.T) {
	h := ep.NewHandler(&ep.Gateway{Latency: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	msg := newMessage(t, requestBody(t, "pay_1", "tok_visa"), 1)
	msg.SetContext(ctx)
	_, err := h.Handle(msg)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, sluice.ClassRetryable, sluice.ClassOf(err))
}

func TestHandler_OutputsAreNewMessages(t *testing.T) {
	h := ep.NewHandler(ep.NewGateway())
	in := newMessage(t, requestBody(t, "pay_1", "tok_visa"), 1)
	in.Metadata.Set(headers.TraceParent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	out1, err := h.Handle(in)
	require.NoError(t, err)
	in2 := newMessage(t, requestBody(t, "pay_2", "tok_visa"), 1)
	out2, err := h.Handle(in2)
	require.NoError(t, err)

	require.Len(t, out1, 1)
	require.Len(t, out2, 1)
	assert.NotEqual(t, in.UUID, out1[0].UUID)
	assert.NotEqual(t, out1[0].UUID, out2[0].UUID)
	assert.Empty(t, out1[0].Metadata.Get(headers.TraceParent), "trace context is the stack's job")
}

// The demo finds its own run's events by the correlation id of its requests.
func TestHandler_EventKeepsTheCorrelationID(t *testing.T) {
	h := ep.NewHandler(ep.NewGateway())
	in := newMessage(t, requestBody(t, "pay_1", "tok_visa"), 1)
	middleware.SetCorrelationID("run-7", in)
	out, err := h.Handle(in)
	require.NoError(t, err)
	require.Len(t, out, 1)
	assert.Equal(t, "run-7", middleware.MessageCorrelationID(out[0]))

	out, err = h.Handle(newMessage(t, requestBody(t, "pay_2", "tok_visa"), 1))
	require.NoError(t, err)
	require.Len(t, out, 1)
	assert.Empty(t, middleware.MessageCorrelationID(out[0]), "none without one on the request")
}

func TestNewHandler_NilGatewayPanics(t *testing.T) {
	assert.PanicsWithValue(t, "example_payment: NewHandler called with a nil *Gateway", func() { ep.NewHandler(nil) })
	g := ep.NewGateway()
	assert.Same(t, g, ep.NewHandler(g).Gateway())
}

func TestKeyFunc(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		want     string
		wantType string // "" means no error
	}{
		{name: "valid", body: validBody, want: "pay_1"},
		{name: "unknown fields", body: `{"payment_id":"pay_9","order_id":"o","amount_cents":1,"currency":"USD","source":"tok_panic","x":1}`, want: "pay_9"},
		{name: "invalid JSON", body: `{"payment_id":"pay_1"`, wantType: ep.ErrorTypeDecode},
		{name: "empty body", body: ``, wantType: ep.ErrorTypeDecode},
		{name: "missing payment_id", body: `{"order_id":"ord_1","amount_cents":1299,"currency":"EUR","source":"tok_visa"}`, wantType: ep.ErrorTypeValidation},
		{name: "invalid other field", body: `{"payment_id":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"EURO","source":"tok_visa"}`, wantType: ep.ErrorTypeValidation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, err := ep.KeyFunc(message.NewMessage(watermill.NewUUID(), []byte(tt.body)))
			if tt.wantType == "" {
				require.NoError(t, err)
				assert.Equal(t, tt.want, key)
				return
			}
			require.Error(t, err)
			assert.Empty(t, key)
			assert.Equal(t, sluice.ClassPermanent, sluice.ClassOf(err))
			assert.Equal(t, tt.wantType, sluice.ErrorType(err))
		})
	}
}

func TestQueueNames(t *testing.T) {
	assert.Equal(t, "payments.requested", ep.QueueRequested)
	assert.Equal(t, "payments.succeeded", ep.QueueSucceeded)
	assert.Equal(t, "payments.requested.dlq", topology.DLQ(ep.QueueRequested))
}
