package example_payment_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sluice "github.com/sluice-go/sluice"
	ep "github.com/sluice-go/sluice/handlers/example_payment"
)

var allKinds = []ep.DemoKind{
	ep.KindSuccess, ep.KindInsufficientFunds, ep.KindFlaky, ep.KindTimeout, ep.KindRateLimited,
	ep.KindPanic, ep.KindDuplicate, ep.KindMalformedJSON, ep.KindMissingField, ep.KindEmptyField,
	ep.KindNonPositiveAmount, ep.KindBadCurrency, ep.KindAmountString, ep.KindAmountFloat,
}

func allTokens() []string {
	tokens := []string{ep.TokenInsufficientFunds, ep.TokenTimeout, ep.TokenRateLimited, ep.TokenPanic}
	for n := 1; n <= ep.MaxFlakyFailures; n++ {
		tokens = append(tokens, ep.FlakyToken(n))
	}
	return tokens
}

func TestDemoMix_LengthAndDeterminism(t *testing.T) {
	tests := []struct {
		n    int
		seed int64
	}{
		{n: 0, seed: 1}, {n: -3, seed: 1}, {n: 1, seed: 1}, {n: 5, seed: 7},
		{n: ep.DemoMixMinimum, seed: 1}, {n: 100, seed: 42}, {n: 1000, seed: -9},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("n=%d,seed=%d", tt.n, tt.seed), func(t *testing.T) {
			a := ep.DemoMix(tt.n, tt.seed)
			assert.Len(t, a, max(tt.n, 0))
			assert.Equal(t, a, ep.DemoMix(tt.n, tt.seed), "same n and seed, same mix")
		})
	}
	assert.NotEqual(t, ep.DemoMix(50, 1), ep.DemoMix(50, 2), "different seeds, different mixes")
}

func TestDemoMix_CoversEveryKindAndToken(t *testing.T) {
	for _, tt := range []struct {
		n    int
		seed int64
	}{{ep.DemoMixMinimum, 0}, {ep.DemoMixMinimum, 1}, {ep.DemoMixMinimum, -1}, {100, 99}, {1000, 3}} {
		t.Run(fmt.Sprintf("n=%d,seed=%d", tt.n, tt.seed), func(t *testing.T) {
			reqs := ep.DemoMix(tt.n, tt.seed)
			assert.Empty(t, missing(reqs))
			for _, d := range reqs {
				assert.Contains(t, allKinds, d.Kind)
			}
		})
	}
}

// missing returns the kinds and tokens that reqs do not cover.
func missing(reqs []ep.DemoRequest) []string {
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
		assert.Empty(t, missing(ep.DemoMix(ep.DemoMixMinimum, seed)), "seed %d", seed)
		assert.NotEmpty(t, missing(ep.DemoMix(ep.DemoMixMinimum-1, seed)), "seed %d: one request fewer cannot cover everything", seed)
	}
}

var malformed = map[ep.DemoKind]bool{
	ep.KindMalformedJSON: true, ep.KindMissingField: true, ep.KindEmptyField: true, ep.KindNonPositiveAmount: true,
	ep.KindBadCurrency: true, ep.KindAmountString: true, ep.KindAmountFloat: true,
}

func TestDemoMix_Structure(t *testing.T) {
	reqs := ep.DemoMix(500, 7)
	firstIndex := map[string]int{}
	copies := map[string]int{}
	for i, d := range reqs {
		copies[d.PaymentID]++
		require.NotEmpty(t, d.PaymentID, "request %d", i)
		if d.Kind != ep.KindDuplicate {
			_, seen := firstIndex[d.PaymentID]
			require.False(t, seen, "payment %s reused by a %s request", d.PaymentID, d.Kind)
			firstIndex[d.PaymentID] = i
			assert.Equal(t, d.ExpectWithin(ep.DemoMaxAttempts), d.Expect)
			continue
		}
		orig, seen := firstIndex[d.PaymentID]
		require.True(t, seen, "duplicate %d of %s comes before its original", i, d.PaymentID)
		assert.Equal(t, ep.KindSuccess, reqs[orig].Kind, "only first-attempt successes are duplicated")
		assert.Equal(t, reqs[orig].Body, d.Body, "a duplicate repeats the body byte for byte")
		assert.Equal(t, ep.Expectation{Outcome: ep.ExpectDuplicate}, d.Expect)
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
	succeededOn := func(n int) ep.Expectation { return ep.Expectation{Outcome: ep.ExpectSucceeded, Attempts: n} }
	deadOn := func(n int, typ string) ep.Expectation {
		return ep.Expectation{Outcome: ep.ExpectDeadLettered, Attempts: n, ErrorType: typ}
	}
	tests := []struct {
		name        string
		req         ep.DemoRequest
		maxAttempts int
		want        ep.Expectation
	}{
		{"success", ep.DemoRequest{Kind: ep.KindSuccess, Source: "tok_visa"}, 1, succeededOn(1)},
		{"insufficient funds", ep.DemoRequest{Kind: ep.KindInsufficientFunds, Source: ep.TokenInsufficientFunds}, 5, deadOn(1, ep.ErrorTypeInsufficientFunds)},
		{"flaky within policy", ep.DemoRequest{Kind: ep.KindFlaky, Source: ep.FlakyToken(4)}, 5, succeededOn(5)},
		{"flaky beyond policy", ep.DemoRequest{Kind: ep.KindFlaky, Source: ep.FlakyToken(5)}, 5, deadOn(5, ep.ErrorTypeGatewayTimeout)},
		{"flaky 9 within DemoMaxAttempts", ep.DemoRequest{Kind: ep.KindFlaky, Source: ep.FlakyToken(9)}, ep.DemoMaxAttempts, succeededOn(10)},
		{"timeout", ep.DemoRequest{Kind: ep.KindTimeout, Source: ep.TokenTimeout}, 3, deadOn(3, ep.ErrorTypeGatewayTimeout)},
		{"rate limited", ep.DemoRequest{Kind: ep.KindRateLimited, Source: ep.TokenRateLimited}, 2, succeededOn(2)},
		{"rate limited without retries", ep.DemoRequest{Kind: ep.KindRateLimited, Source: ep.TokenRateLimited}, 1, deadOn(1, ep.ErrorTypeRateLimited)},
		{"panic", ep.DemoRequest{Kind: ep.KindPanic, Source: ep.TokenPanic}, 4, deadOn(4, ep.ErrorTypePanic)},
		{"duplicate", ep.DemoRequest{Kind: ep.KindDuplicate, Source: "tok_visa"}, 4, ep.Expectation{Outcome: ep.ExpectDuplicate}},
		{"malformed JSON", ep.DemoRequest{Kind: ep.KindMalformedJSON}, 4, deadOn(1, ep.ErrorTypeDecode)},
		{"bad currency", ep.DemoRequest{Kind: ep.KindBadCurrency, Source: "tok_visa"}, 4, deadOn(1, ep.ErrorTypeValidation)},
		{"amount float", ep.DemoRequest{Kind: ep.KindAmountFloat, Source: ep.TokenTimeout}, 4, deadOn(1, ep.ErrorTypeValidation)},
		{"zero max attempts counts as one", ep.DemoRequest{Kind: ep.KindTimeout, Source: ep.TokenTimeout}, 0, deadOn(1, ep.ErrorTypeGatewayTimeout)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.req.ExpectWithin(tt.maxAttempts))
		})
	}
}

// simulate runs reqs through a stand-in for the stack, in order and one at a time: a
// recoverer (a panic is an error of type ep.ErrorTypePanic), dead-lettering of permanent
// errors, up to maxAttempts attempts with x-retry-count incremented on each retry, and an
// idempotency step keyed by KeyFunc that remembers completed payments. It returns what
// happened to each request.
func simulate(t *testing.T, h *ep.Handler, reqs []ep.DemoRequest, maxAttempts int) []ep.Expectation {
	t.Helper()
	done := map[string]bool{}
	got := make([]ep.Expectation, len(reqs))
	for i, d := range reqs {
		key, err := ep.KeyFunc(message.NewMessage(watermill.NewUUID(), d.Body))
		if err != nil {
			require.True(t, sluice.IsPermanent(err), "request %d: KeyFunc error %v must be permanent", i, err)
			got[i] = ep.Expectation{Outcome: ep.ExpectDeadLettered, Attempts: 1, ErrorType: sluice.ErrorType(err)}
			continue
		}
		if done[key] {
			got[i] = ep.Expectation{Outcome: ep.ExpectDuplicate}
			continue
		}
		for attempt := 1; ; attempt++ {
			msg := newMessage(t, d.Body, attempt)
			out, err := handleRecovering(h, msg)
			if err == nil {
				ev := succeeded(t, out)
				require.Equal(t, d.PaymentID, ev.PaymentID)
				got[i] = ep.Expectation{Outcome: ep.ExpectSucceeded, Attempts: ev.Attempts}
				done[key] = true
				break
			}
			if sluice.IsPermanent(err) || attempt >= maxAttempts {
				got[i] = ep.Expectation{Outcome: ep.ExpectDeadLettered, Attempts: attempt, ErrorType: sluice.ErrorType(err)}
				break
			}
		}
	}
	return got
}

type panicError struct{ value any }

func (e *panicError) Error() string     { return fmt.Sprint("panic: ", e.value) }
func (e *panicError) ErrorType() string { return ep.ErrorTypePanic }

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
		{n: ep.DemoMixMinimum, seed: 1, maxAttempts: ep.DemoMaxAttempts},
		{n: 300, seed: 2, maxAttempts: ep.DemoMaxAttempts},
		{n: 300, seed: 3, maxAttempts: 3},
		{n: 100, seed: 4, maxAttempts: 1},
		{n: 100, seed: 5, maxAttempts: 20},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("n=%d,seed=%d,maxAttempts=%d", tt.n, tt.seed, tt.maxAttempts), func(t *testing.T) {
			g := ep.NewGateway()
			reqs := ep.DemoMix(tt.n, tt.seed)
			got := simulate(t, ep.NewHandler(g), reqs, tt.maxAttempts)

			wantCharges := 0
			for i, d := range reqs {
				want := d.ExpectWithin(tt.maxAttempts)
				if tt.maxAttempts == ep.DemoMaxAttempts {
					require.Equal(t, d.Expect, want)
				}
				assert.Equal(t, want, got[i], "request %d (%s, %s): %s", i, d.Kind, d.Source, d.Body)
				if want.Outcome == ep.ExpectSucceeded {
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
	var dup *ep.DemoRequest
	reqs := ep.DemoMix(ep.DemoMixMinimum, 1)
	for i := range reqs {
		if reqs[i].Kind == ep.KindDuplicate {
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
	for _, d := range ep.DemoMix(60, 11) {
		if d.Kind != ep.KindSuccess {
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
