package paymentdemo_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sluice "github.com/sluice-go/sluice"
	ep "github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/demo/paymentdemo"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
)

var allKinds = []paymentdemo.Kind{
	paymentdemo.KindSuccess, paymentdemo.KindInsufficientFunds, paymentdemo.KindFlaky, paymentdemo.KindTimeout, paymentdemo.KindRateLimited,
	paymentdemo.KindPanic, paymentdemo.KindDuplicate, paymentdemo.KindMalformedJSON, paymentdemo.KindMissingField, paymentdemo.KindEmptyField,
	paymentdemo.KindNonPositiveAmount, paymentdemo.KindBadCurrency, paymentdemo.KindAmountString, paymentdemo.KindAmountFloat,
}

func allTokens() []string {
	tokens := []string{paymentsim.TokenInsufficientFunds, paymentsim.TokenTimeout, paymentsim.TokenRateLimited, paymentsim.TokenPanic}
	for n := 1; n <= paymentsim.MaxFlakyFailures; n++ {
		tokens = append(tokens, paymentsim.FlakyToken(n))
	}
	return tokens
}

func TestDemoMix_LengthAndDeterminism(t *testing.T) {
	tests := []struct {
		n    int
		seed int64
	}{
		{n: 0, seed: 1}, {n: -3, seed: 1}, {n: 1, seed: 1}, {n: 5, seed: 7},
		{n: paymentdemo.MixMinimum, seed: 1}, {n: 100, seed: 42}, {n: 1000, seed: -9},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("n=%d,seed=%d", tt.n, tt.seed), func(t *testing.T) {
			a := paymentdemo.Mix(tt.n, tt.seed)
			assert.Len(t, a, max(tt.n, 0))
			assert.Equal(t, a, paymentdemo.Mix(tt.n, tt.seed), "same n and seed, same mix")
		})
	}
	assert.NotEqual(t, paymentdemo.Mix(50, 1), paymentdemo.Mix(50, 2), "different seeds, different mixes")
}

func TestDemoMix_CoversEveryKindAndToken(t *testing.T) {
	for _, tt := range []struct {
		n    int
		seed int64
	}{{paymentdemo.MixMinimum, 0}, {paymentdemo.MixMinimum, 1}, {paymentdemo.MixMinimum, -1}, {100, 99}, {1000, 3}} {
		t.Run(fmt.Sprintf("n=%d,seed=%d", tt.n, tt.seed), func(t *testing.T) {
			reqs := paymentdemo.Mix(tt.n, tt.seed)
			assert.Empty(t, missing(reqs))
			for _, d := range reqs {
				assert.Contains(t, allKinds, d.Kind)
			}
		})
	}
}

// missing returns the kinds and tokens that reqs do not cover.
func missing(reqs []paymentdemo.Request) []string {
	seen := map[string]bool{}
	for _, d := range reqs {
		seen["kind "+string(d.Kind)] = true
		seen["token "+d.Source] = true
	}
	var out []string
	for _, k := range allKinds {
		if !seen["kind "+string(k)] {
			out = append(out, "kind "+string(k))
		}
	}
	for _, tok := range allTokens() {
		if !seen["token "+tok] {
			out = append(out, "token "+tok)
		}
	}
	return out
}

func TestDemoMix_MinimumIsTight(t *testing.T) {
	for seed := int64(0); seed < 20; seed++ {
		assert.Empty(t, missing(paymentdemo.Mix(paymentdemo.MixMinimum, seed)), "seed %d", seed)
		assert.NotEmpty(t, missing(paymentdemo.Mix(paymentdemo.MixMinimum-1, seed)), "seed %d: one request fewer cannot cover everything", seed)
	}
}

var malformed = map[paymentdemo.Kind]bool{
	paymentdemo.KindMalformedJSON: true, paymentdemo.KindMissingField: true, paymentdemo.KindEmptyField: true, paymentdemo.KindNonPositiveAmount: true,
	paymentdemo.KindBadCurrency: true, paymentdemo.KindAmountString: true, paymentdemo.KindAmountFloat: true,
}

func TestDemoMix_Structure(t *testing.T) {
	reqs := paymentdemo.Mix(500, 7)
	firstIndex := map[string]int{}
	copies := map[string]int{}
	for i, d := range reqs {
		copies[d.PaymentID]++
		require.NotEmpty(t, d.PaymentID, "request %d", i)
		if d.Kind != paymentdemo.KindDuplicate {
			_, seen := firstIndex[d.PaymentID]
			require.False(t, seen, "payment %s reused by a %s request", d.PaymentID, d.Kind)
			firstIndex[d.PaymentID] = i
			assert.Equal(t, d.ExpectWithin(paymentdemo.MaxAttempts), d.Expect)
			continue
		}
		orig, seen := firstIndex[d.PaymentID]
		require.True(t, seen, "duplicate %d of %s comes before its original", i, d.PaymentID)
		assert.Equal(t, paymentdemo.KindSuccess, reqs[orig].Kind, "only first-attempt successes are duplicated")
		assert.Equal(t, reqs[orig].Body, d.Body, "a duplicate repeats the body byte for byte")
		assert.Equal(t, paymentdemo.Expectation{Outcome: paymentdemo.ExpectDuplicate}, d.Expect)
	}
	for id, n := range copies {
		assert.LessOrEqual(t, n, 2, "payment %s sent %d times", id, n)
	}

	// Decoding agrees with the kind: valid kinds decode to their ID and source, malformed
	// ones fail with the expected type.
	for i, d := range reqs {
		req, err := ep.Decode(d.Body)
		if malformed[d.Kind] {
			require.Error(t, err, "request %d (%s): %s", i, d.Kind, d.Body)
			assert.Equal(t, d.Expect.ErrorType, sluice.ErrorType(err), "request %d (%s)", i, d.Kind)
			continue
		}
		require.NoError(t, err, "request %d (%s): %s", i, d.Kind, d.Body)
		assert.Equal(t, d.PaymentID, req.PaymentID)
		assert.Equal(t, d.Source, req.Source)
	}
}

func TestDemoRequest_ExpectWithin(t *testing.T) {
	succeededOn := func(n int) paymentdemo.Expectation {
		return paymentdemo.Expectation{Outcome: paymentdemo.ExpectSucceeded, Attempts: n}
	}
	deadOn := func(n int, typ string) paymentdemo.Expectation {
		return paymentdemo.Expectation{Outcome: paymentdemo.ExpectDeadLettered, Attempts: n, ErrorType: typ}
	}
	tests := []struct {
		name        string
		req         paymentdemo.Request
		maxAttempts int
		want        paymentdemo.Expectation
	}{
		{"success", paymentdemo.Request{Kind: paymentdemo.KindSuccess, Source: "tok_visa"}, 1, succeededOn(1)},
		{"insufficient funds", paymentdemo.Request{Kind: paymentdemo.KindInsufficientFunds, Source: paymentsim.TokenInsufficientFunds}, 5, deadOn(1, ep.ErrorTypeInsufficientFunds)},
		{"flaky within policy", paymentdemo.Request{Kind: paymentdemo.KindFlaky, Source: paymentsim.FlakyToken(4)}, 5, succeededOn(5)},
		{"flaky beyond policy", paymentdemo.Request{Kind: paymentdemo.KindFlaky, Source: paymentsim.FlakyToken(5)}, 5, deadOn(5, ep.ErrorTypeGatewayTimeout)},
		{"flaky 9 within DemoMaxAttempts", paymentdemo.Request{Kind: paymentdemo.KindFlaky, Source: paymentsim.FlakyToken(9)}, paymentdemo.MaxAttempts, succeededOn(10)},
		{"timeout", paymentdemo.Request{Kind: paymentdemo.KindTimeout, Source: paymentsim.TokenTimeout}, 3, deadOn(3, ep.ErrorTypeGatewayTimeout)},
		{"rate limited", paymentdemo.Request{Kind: paymentdemo.KindRateLimited, Source: paymentsim.TokenRateLimited}, 2, succeededOn(2)},
		{"rate limited without retries", paymentdemo.Request{Kind: paymentdemo.KindRateLimited, Source: paymentsim.TokenRateLimited}, 1, deadOn(1, paymentsim.ErrorTypeRateLimited)},
		{"panic", paymentdemo.Request{Kind: paymentdemo.KindPanic, Source: paymentsim.TokenPanic}, 4, deadOn(4, paymentdemo.ErrorTypePanic)},
		{"duplicate", paymentdemo.Request{Kind: paymentdemo.KindDuplicate, Source: "tok_visa"}, 4, paymentdemo.Expectation{Outcome: paymentdemo.ExpectDuplicate}},
		{"malformed JSON", paymentdemo.Request{Kind: paymentdemo.KindMalformedJSON}, 4, deadOn(1, ep.ErrorTypeDecode)},
		{"bad currency", paymentdemo.Request{Kind: paymentdemo.KindBadCurrency, Source: "tok_visa"}, 4, deadOn(1, ep.ErrorTypeValidation)},
		{"amount float", paymentdemo.Request{Kind: paymentdemo.KindAmountFloat, Source: paymentsim.TokenTimeout}, 4, deadOn(1, ep.ErrorTypeValidation)},
		{"zero max attempts counts as one", paymentdemo.Request{Kind: paymentdemo.KindTimeout, Source: paymentsim.TokenTimeout}, 0, deadOn(1, ep.ErrorTypeGatewayTimeout)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.req.ExpectWithin(tt.maxAttempts))
		})
	}
}

// simulate runs reqs through a stand-in for the stack, in order and one at a time: a
// recoverer (a panic is an error of type paymentdemo.ErrorTypePanic), dead-lettering of permanent
// errors, up to maxAttempts attempts with x-retry-count incremented on each retry, and an
// idempotency step keyed by KeyFunc that remembers completed payments. It returns what
// happened to each request.
func simulate(t *testing.T, h *ep.Handler, reqs []paymentdemo.Request, maxAttempts int) []paymentdemo.Expectation {
	t.Helper()
	done := map[string]bool{}
	got := make([]paymentdemo.Expectation, len(reqs))
	for i, d := range reqs {
		key, err := ep.KeyFunc(message.NewMessage(watermill.NewUUID(), d.Body))
		if err != nil {
			require.Equal(t, sluice.ClassPermanent, sluice.ClassOf(err), "request %d: KeyFunc error %v must be permanent", i, err)
			got[i] = paymentdemo.Expectation{Outcome: paymentdemo.ExpectDeadLettered, Attempts: 1, ErrorType: sluice.ErrorType(err)}
			continue
		}
		if done[key] {
			got[i] = paymentdemo.Expectation{Outcome: paymentdemo.ExpectDuplicate}
			continue
		}
		for attempt := 1; ; attempt++ {
			msg := newMessage(t, d.Body, attempt)
			out, err := handleRecovering(h, msg)
			if err == nil {
				ev := succeeded(t, out)
				require.Equal(t, d.PaymentID, ev.PaymentID)
				got[i] = paymentdemo.Expectation{Outcome: paymentdemo.ExpectSucceeded, Attempts: ev.Attempts}
				done[key] = true
				break
			}
			if sluice.ClassOf(err) == sluice.ClassPermanent || attempt >= maxAttempts {
				got[i] = paymentdemo.Expectation{Outcome: paymentdemo.ExpectDeadLettered, Attempts: attempt, ErrorType: sluice.ErrorType(err)}
				break
			}
		}
	}
	return got
}

type panicError struct{ value any }

func (e *panicError) Error() string     { return fmt.Sprint("panic: ", e.value) }
func (e *panicError) ErrorType() string { return paymentdemo.ErrorTypePanic }

func handleRecovering(h *ep.Handler, msg *message.Message) (out []*message.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, &panicError{value: r}
		}
	}()
	return h.Handle(msg)
}

func TestDemoMix_ExpectationsMatchTheHandler(t *testing.T) {
	tests := []struct {
		n           int
		seed        int64
		maxAttempts int
	}{
		{n: paymentdemo.MixMinimum, seed: 1, maxAttempts: paymentdemo.MaxAttempts},
		{n: 300, seed: 2, maxAttempts: paymentdemo.MaxAttempts},
		{n: 300, seed: 3, maxAttempts: 3},
		{n: 100, seed: 4, maxAttempts: 1},
		{n: 100, seed: 5, maxAttempts: 20},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("n=%d,seed=%d,maxAttempts=%d", tt.n, tt.seed, tt.maxAttempts), func(t *testing.T) {
			g := ep.NewGateway()
			reqs := paymentdemo.Mix(tt.n, tt.seed)
			got := simulate(t, ep.NewHandler(g), reqs, tt.maxAttempts)

			wantCharges := 0
			for i, d := range reqs {
				want := d.ExpectWithin(tt.maxAttempts)
				if tt.maxAttempts == paymentdemo.MaxAttempts {
					require.Equal(t, d.Expect, want)
				}
				assert.Equal(t, want, got[i], "request %d (%s, %s): %s", i, d.Kind, d.Source, d.Body)
				if want.Outcome == paymentdemo.ExpectSucceeded {
					wantCharges++
					assert.Equal(t, 1, g.ChargeCount(d.PaymentID), "payment %s", d.PaymentID)
				}
			}
			assert.Equal(t, wantCharges, g.TotalCharges(), "the idempotency step prevents every double charge")
		})
	}
}

func TestDemoMix_WithoutIdempotencyDuplicatesDoubleCharge(t *testing.T) {
	// The gateway is honest: sending both copies of a duplicated payment to the handler
	// charges it twice. This is what the stack's idempotency step exists to prevent.
	g := ep.NewGateway()
	h := ep.NewHandler(g)
	var dup *paymentdemo.Request
	reqs := paymentdemo.Mix(paymentdemo.MixMinimum, 1)
	for i := range reqs {
		if reqs[i].Kind == paymentdemo.KindDuplicate {
			dup = &reqs[i]
			break
		}
	}
	require.NotNil(t, dup)
	for range 2 {
		_, err := h.Handle(newMessage(t, dup.Body, 1))
		require.NoError(t, err)
	}
	assert.Equal(t, 2, g.ChargeCount(dup.PaymentID))
}

func TestDemoMix_SucceededEventsAreJSON(t *testing.T) {
	// A success's event carries the request's fields, as the end-to-end tests read them.
	g := ep.NewGateway()
	h := ep.NewHandler(g)
	for _, d := range paymentdemo.Mix(60, 11) {
		if d.Kind != paymentdemo.KindSuccess {
			continue
		}
		out, err := h.Handle(newMessage(t, d.Body, 1))
		require.NoError(t, err)
		var req ep.Request
		require.NoError(t, json.Unmarshal(d.Body, &req))
		ev := succeeded(t, out)
		assert.Equal(t, req.PaymentID, ev.PaymentID)
		assert.Equal(t, req.OrderID, ev.OrderID)
		assert.Equal(t, req.AmountCents, ev.AmountCents)
		assert.Equal(t, req.Currency, ev.Currency)
		assert.NotEmpty(t, ev.ChargeID)
	}
}

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
func succeeded(t *testing.T, out []*message.Message) ep.Succeeded {
	t.Helper()
	require.Len(t, out, 1)
	assert.NotEmpty(t, out[0].UUID)
	assert.Equal(t, paymentsim.ContentTypeJSON, out[0].Metadata.Get("content-type"))
	var ev ep.Succeeded
	require.NoError(t, json.Unmarshal(out[0].Payload, &ev))
	return ev
}
