// Package paymentsim holds the knobs of handlers/example_payment's simulated card gateway
// (its test tokens and the rate-limit refusal) and the wire names the example, its demo
// traffic (internal/demo/paymentdemo), cmd/payments and the end-to-end tests share. They are the
// simulation's internals, not part of what a reader of the example needs.
package paymentsim

import (
	"strconv"
	"strings"
	"time"
)

// Card test tokens the simulated gateway recognises in Request.Source. Any other token is
// charged successfully on the first attempt.
const (
	// TokenInsufficientFunds is declined for insufficient funds on every attempt: a
	// permanent refusal, dead-lettered without retry.
	TokenInsufficientFunds = "tok_insufficient_funds"
	// TokenTimeout times out on every attempt, so the message exhausts its retries.
	TokenTimeout = "tok_timeout"
	// TokenRateLimited is refused with a rate limit on the first attempt, with a
	// Retry-After of RateLimitRetryAfter; the next attempt succeeds.
	TokenRateLimited = "tok_rate_limited"
	// TokenPanic makes Charge panic on every attempt, like a crashing client library.
	TokenPanic = "tok_panic"
	// TokenFlakyPrefix starts the tokens tok_flaky_1 … tok_flaky_9: the first N attempts
	// for a payment time out, then it succeeds. See FlakyToken.
	TokenFlakyPrefix = "tok_flaky_"
)

// RateLimitRetryAfter is the Retry-After the gateway gives with TokenRateLimited.
const RateLimitRetryAfter = 2 * time.Second

// MaxFlakyFailures is the largest N of a tok_flaky_N token.
const MaxFlakyFailures = 9

// FlakyToken returns the token whose first n attempts time out, "tok_flaky_<n>". Only n
// in 1..MaxFlakyFailures makes a flaky token; the gateway treats any other result as an
// ordinary token that succeeds at once.
func FlakyToken(n int) string { return TokenFlakyPrefix + strconv.Itoa(n) }

// FlakyFailures returns N of a tok_flaky_N token, or 0 when source is not one. Exactly one
// digit 1..9 counts, so "tok_flaky_10" and "tok_flaky_01" are ordinary tokens.
func FlakyFailures(source string) int {
	rest, ok := strings.CutPrefix(source, TokenFlakyPrefix)
	if !ok || len(rest) != 1 || rest[0] < '1' || rest[0] > '0'+MaxFlakyFailures {
		return 0
	}
	return int(rest[0] - '0')
}

// ErrorTypeRateLimited is the type of the gateway's rate-limit refusal (TokenRateLimited),
// as sluice.ErrorType reports it.
const ErrorTypeRateLimited = "rate_limited"

// ContentTypeJSON is the content-type metadata of the events the handler publishes.
const ContentTypeJSON = "application/json"

// The JSON names of a payment request's fields, in the order Decode and Validate check them.
const (
	FieldPaymentID   = "payment_id"
	FieldOrderID     = "order_id"
	FieldAmountCents = "amount_cents"
	FieldCurrency    = "currency"
	FieldSource      = "source"
)
