// Package paymentdemo generates the demo traffic of handlers/example_payment: a deterministic
// mix of payment requests covering every card token, duplicates and malformed bodies, each
// with the outcome the full stack must reach. cmd/payments and the end-to-end tests use it.
package paymentdemo

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
)

// ErrorTypePanic is the error type the expectations assume the stack's recoverer records
// for a handler panic (paymentsim.TokenPanic).
const ErrorTypePanic = "panic"

// MaxAttempts is the retry policy (attempts including the first) that Request.Expect
// assumes: the fewest attempts under which every tok_flaky_N token still succeeds. For any
// other policy use Request.ExpectWithin.
const MaxAttempts = paymentsim.MaxFlakyFailures + 1

// ExpectedOutcome is where a demo request ends up when it runs through the full stack.
type ExpectedOutcome string

// The expected outcomes.
const (
	// ExpectSucceeded: one Succeeded event on example_payment.QueueSucceeded and one charge.
	ExpectSucceeded ExpectedOutcome = "succeeded"
	// ExpectDeadLettered: the message lands on example_payment.QueueRequested's dead-letter queue; no event, no charge.
	ExpectDeadLettered ExpectedOutcome = "dead_lettered"
	// ExpectDuplicate: a second copy of a payment already requested; the idempotency step
	// acknowledges it without calling the handler, so no second event and no second charge.
	ExpectDuplicate ExpectedOutcome = "duplicate"
)

// Expectation is what the stack should do with one demo request.
type Expectation struct {
	Outcome ExpectedOutcome
	// Attempts is the attempt, from 1, on which the outcome is reached: for
	// ExpectSucceeded the event's attempts field; for ExpectDeadLettered the attempt that
	// was dead-lettered (its x-retry-count is Attempts-1); 0 for ExpectDuplicate.
	Attempts int
	// ErrorType is the type of the error that dead-lettered the message (the failure
	// record's x-last-error); empty unless Outcome is ExpectDeadLettered.
	ErrorType string
}

// Kind is what a demo request exercises.
type Kind string

// The demo kinds. Each one is a source token or a way a request can be malformed.
const (
	// KindSuccess uses an ordinary token (tok_visa, tok_mastercard, tok_amex).
	KindSuccess Kind = "success"
	// KindInsufficientFunds uses paymentsim.TokenInsufficientFunds.
	KindInsufficientFunds Kind = "insufficient_funds"
	// KindFlaky uses a tok_flaky_N token.
	KindFlaky Kind = "flaky"
	// KindTimeout uses paymentsim.TokenTimeout.
	KindTimeout Kind = "timeout"
	// KindRateLimited uses paymentsim.TokenRateLimited.
	KindRateLimited Kind = "rate_limited"
	// KindPanic uses paymentsim.TokenPanic.
	KindPanic Kind = "panic"
	// KindDuplicate repeats, byte for byte, an earlier KindSuccess request of the mix.
	KindDuplicate Kind = "duplicate"
	// KindMalformedJSON is a body cut in the middle: not JSON.
	KindMalformedJSON Kind = "malformed_json"
	// KindMissingField lacks one required field (never payment_id).
	KindMissingField Kind = "missing_field"
	// KindEmptyField has order_id or source "".
	KindEmptyField Kind = "empty_field"
	// KindNonPositiveAmount has amount_cents 0 or negative.
	KindNonPositiveAmount Kind = "non_positive_amount"
	// KindBadCurrency has a currency that is not three capital letters.
	KindBadCurrency Kind = "bad_currency"
	// KindAmountString has amount_cents as a JSON string.
	KindAmountString Kind = "amount_string"
	// KindAmountFloat has amount_cents with a fraction.
	KindAmountFloat Kind = "amount_float"
)

// Request is one message of a demo mix with the outcome it must reach.
type Request struct {
	Kind Kind
	// PaymentID is the payment_id in Body. For KindMalformedJSON it is the ID the body
	// was cut from, which neither the handler nor example_payment.KeyFunc can read.
	PaymentID string
	// Source is the card token in Body; empty when Body has none that decodes.
	Source string
	// Body is the message payload to publish to example_payment.QueueRequested.
	Body []byte
	// Expect is the expected outcome when the retry policy allows MaxAttempts attempts
	// and the stack runs the idempotency step with example_payment.KeyFunc.
	Expect Expectation
}

// ExpectWithin returns the expected outcome when the retry policy allows maxAttempts
// attempts (including the first; values below 1 count as 1). A flaky or rate-limited
// payment that needs more attempts is dead-lettered on the last one with the error of
// that attempt; tok_timeout and tok_panic are dead-lettered on the last attempt.
func (d Request) ExpectWithin(maxAttempts int) Expectation {
	maxAttempts = max(maxAttempts, 1)
	switch d.Kind {
	case KindDuplicate:
		return Expectation{Outcome: ExpectDuplicate}
	case KindMalformedJSON:
		return deadLettered(1, example_payment.ErrorTypeDecode)
	case KindMissingField, KindEmptyField, KindNonPositiveAmount, KindBadCurrency, KindAmountString, KindAmountFloat:
		return deadLettered(1, example_payment.ErrorTypeValidation)
	}
	switch d.Source {
	case paymentsim.TokenInsufficientFunds:
		return deadLettered(1, example_payment.ErrorTypeInsufficientFunds)
	case paymentsim.TokenTimeout:
		return deadLettered(maxAttempts, example_payment.ErrorTypeGatewayTimeout)
	case paymentsim.TokenPanic:
		return deadLettered(maxAttempts, ErrorTypePanic)
	case paymentsim.TokenRateLimited:
		return succeedsOn(2, maxAttempts, paymentsim.ErrorTypeRateLimited)
	default:
		return succeedsOn(paymentsim.FlakyFailures(d.Source)+1, maxAttempts, example_payment.ErrorTypeGatewayTimeout)
	}
}

func deadLettered(attempt int, errorType string) Expectation {
	return Expectation{Outcome: ExpectDeadLettered, Attempts: attempt, ErrorType: errorType}
}

// succeedsOn is the expectation of a payment that fails with failType until attempt n.
func succeedsOn(n, maxAttempts int, failType string) Expectation {
	if n > maxAttempts {
		return deadLettered(maxAttempts, failType)
	}
	return Expectation{Outcome: ExpectSucceeded, Attempts: n}
}

// demoKindWeight is how often each kind appears in the part of a mix beyond its first
// MixMinimum requests: mostly successes, as in a real payment stream.
var demoKindWeight = []struct {
	kind   Kind
	weight int
}{
	{KindSuccess, 55},
	{KindFlaky, 12},
	{KindDuplicate, 10},
	{KindInsufficientFunds, 5},
	{KindRateLimited, 5},
	{KindTimeout, 3},
	{KindPanic, 2},
	{KindMalformedJSON, 2},
	{KindMissingField, 1},
	{KindEmptyField, 1},
	{KindNonPositiveAmount, 1},
	{KindBadCurrency, 1},
	{KindAmountString, 1},
	{KindAmountFloat, 1},
}

// demoCover lists the requests that make a mix cover every kind and every token; a flaky
// entry is the N of its token.
type demoSlot struct {
	kind  Kind
	flaky int
}

func demoCover() []demoSlot {
	slots := []demoSlot{
		{kind: KindSuccess}, {kind: KindInsufficientFunds}, {kind: KindTimeout},
		{kind: KindRateLimited}, {kind: KindPanic}, {kind: KindDuplicate},
		{kind: KindMalformedJSON}, {kind: KindMissingField}, {kind: KindEmptyField},
		{kind: KindNonPositiveAmount}, {kind: KindBadCurrency}, {kind: KindAmountString},
		{kind: KindAmountFloat},
	}
	for n := 1; n <= paymentsim.MaxFlakyFailures; n++ {
		slots = append(slots, demoSlot{kind: KindFlaky, flaky: n})
	}
	return slots
}

// MixMinimum is the smallest n for which Mix covers every kind and every token
// (each tok_flaky_N included): one request for each of the 13 kinds other than KindFlaky,
// and one per flaky token.
const MixMinimum = 13 + paymentsim.MaxFlakyFailures

var (
	demoSuccessTokens = []string{"tok_visa", "tok_mastercard", "tok_amex"}
	demoCurrencies    = []string{"EUR", "USD", "GBP", "CHF", "JPY"}
	demoBadCurrencies = []string{"eur", "EURO", "US", "E1R", "€UR"}
)

// Mix returns n demo requests, the same for the same n and seed (within one Go
// release): for n >= MixMinimum, at least one of every Kind and every token, then
// a weighted random mix, all in a shuffled order. Payment IDs are unique except for
// KindDuplicate, which repeats an earlier KindSuccess request (each at most once) and
// always comes after it; only first-attempt successes are repeated, so the duplicate's
// expectation does not depend on timing. The seed is part of every ID, so mixes with
// different seeds can share a stack. n <= 0 returns nil.
//
// Under concurrency either copy of a duplicated payment may be the one that runs:
// assert per payment ID (one event, ChargeCount 1), not per copy.
func Mix(n int, seed int64) []Request {
	if n <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed_51c0_1ce))

	slots := demoCover()
	if n < len(slots) {
		rng.Shuffle(len(slots), func(i, j int) { slots[i], slots[j] = slots[j], slots[i] })
		slots = slots[:n]
	}
	for len(slots) < n {
		slots = append(slots, randomSlot(rng))
	}
	rng.Shuffle(len(slots), func(i, j int) { slots[i], slots[j] = slots[j], slots[i] })
	ensureSuccessBeforeDuplicate(slots)

	tag := strconv.FormatUint(uint64(seed), 36)
	out := make([]Request, 0, n)
	var unrepeated []int // indexes in out of KindSuccess requests not yet duplicated
	for i, s := range slots {
		if s.kind == KindDuplicate {
			if len(unrepeated) > 0 {
				k := rng.IntN(len(unrepeated))
				orig := out[unrepeated[k]]
				unrepeated = append(unrepeated[:k], unrepeated[k+1:]...)
				d := Request{Kind: KindDuplicate, PaymentID: orig.PaymentID, Source: orig.Source, Body: orig.Body}
				d.Expect = d.ExpectWithin(MaxAttempts)
				out = append(out, d)
				continue
			}
			// Nothing left to repeat: this slot becomes a fresh success.
			s = demoSlot{kind: KindSuccess}
		}
		d := newDemoRequest(rng, s, fmt.Sprintf("pay_%s_%05d", tag, i), fmt.Sprintf("ord_%s_%05d", tag, i))
		d.Expect = d.ExpectWithin(MaxAttempts)
		if d.Kind == KindSuccess {
			unrepeated = append(unrepeated, len(out))
		}
		out = append(out, d)
	}
	return out
}

func randomSlot(rng *rand.Rand) demoSlot {
	total := 0
	for _, w := range demoKindWeight {
		total += w.weight
	}
	r := rng.IntN(total)
	for _, w := range demoKindWeight {
		if r < w.weight {
			if w.kind == KindFlaky {
				return demoSlot{kind: KindFlaky, flaky: 1 + rng.IntN(paymentsim.MaxFlakyFailures)}
			}
			return demoSlot{kind: w.kind}
		}
		r -= w.weight
	}
	return demoSlot{kind: KindSuccess}
}

// ensureSuccessBeforeDuplicate swaps the first duplicate with the first success when the
// shuffle put the duplicate first, so the mix's covering duplicate has an original.
func ensureSuccessBeforeDuplicate(slots []demoSlot) {
	dup, succ := -1, -1
	for i, s := range slots {
		if s.kind == KindDuplicate && dup < 0 {
			dup = i
		}
		if s.kind == KindSuccess && succ < 0 {
			succ = i
		}
	}
	if dup >= 0 && succ > dup {
		slots[dup], slots[succ] = slots[succ], slots[dup]
	}
}

func newDemoRequest(rng *rand.Rand, s demoSlot, paymentID, orderID string) Request {
	req := example_payment.Request{
		PaymentID:   paymentID,
		OrderID:     orderID,
		AmountCents: 100 + rng.Int64N(99_900),
		Currency:    demoCurrencies[rng.IntN(len(demoCurrencies))],
		Source:      demoSuccessTokens[rng.IntN(len(demoSuccessTokens))],
	}
	switch s.kind {
	case KindInsufficientFunds:
		req.Source = paymentsim.TokenInsufficientFunds
	case KindFlaky:
		req.Source = paymentsim.FlakyToken(s.flaky)
	case KindTimeout:
		req.Source = paymentsim.TokenTimeout
	case KindRateLimited:
		req.Source = paymentsim.TokenRateLimited
	case KindPanic:
		req.Source = paymentsim.TokenPanic
	}
	d := Request{Kind: s.kind, PaymentID: paymentID, Source: req.Source}

	// Malformed requests are built as field maps, so a field can be absent or mistyped.
	fields := map[string]any{
		paymentsim.FieldPaymentID:   req.PaymentID,
		paymentsim.FieldOrderID:     req.OrderID,
		paymentsim.FieldAmountCents: req.AmountCents,
		paymentsim.FieldCurrency:    req.Currency,
		paymentsim.FieldSource:      req.Source,
	}
	switch s.kind {
	case KindMissingField:
		missing := []string{paymentsim.FieldOrderID, paymentsim.FieldAmountCents, paymentsim.FieldCurrency, paymentsim.FieldSource}[rng.IntN(4)]
		delete(fields, missing)
	case KindEmptyField:
		fields[[]string{paymentsim.FieldOrderID, paymentsim.FieldSource}[rng.IntN(2)]] = ""
	case KindNonPositiveAmount:
		fields[paymentsim.FieldAmountCents] = -rng.Int64N(1000) // 0 included
	case KindBadCurrency:
		fields[paymentsim.FieldCurrency] = demoBadCurrencies[rng.IntN(len(demoBadCurrencies))]
	case KindAmountString:
		fields[paymentsim.FieldAmountCents] = strconv.FormatInt(req.AmountCents, 10)
	case KindAmountFloat:
		fields[paymentsim.FieldAmountCents] = float64(req.AmountCents) + 0.5
	}
	body, err := json.Marshal(fields)
	if err != nil {
		panic(fmt.Sprintf("example_payment: encode demo request %s: %v", paymentID, err)) // plain values: unreachable
	}
	if s.kind == KindMalformedJSON {
		body = body[:len(body)/2]
	}
	if src, ok := fields[paymentsim.FieldSource]; !ok || src == "" || s.kind == KindMalformedJSON {
		d.Source = "" // no token the handler could read
	}
	d.Body = body
	return d
}
