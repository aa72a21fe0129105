package example_payment

import (
	"context"
	"fmt"
	"sync"
	"time"

	sluice "github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
)

// Error types of the gateway's refusals, as sluice.ErrorType reports them.
const (
	// ErrorTypeInsufficientFunds is the type of a decline for insufficient funds.
	ErrorTypeInsufficientFunds = "insufficient_funds"
	// ErrorTypeGatewayTimeout is the type of a gateway timeout.
	ErrorTypeGatewayTimeout = "gateway_timeout"
)

// insufficientFundsError is the gateway's decline of paymentsim.TokenInsufficientFunds. Charge returns
// it wrapped in sluice.Permanent: retrying a decline only annoys the card holder.
type insufficientFundsError struct {
	PaymentID   string
	AmountCents int64
	Currency    string
}

// Error names the payment and the amount declined.
func (e *insufficientFundsError) Error() string {
	return fmt.Sprintf("payment %q declined: insufficient funds for %d %s", e.PaymentID, e.AmountCents, e.Currency)
}

// ErrorType returns ErrorTypeInsufficientFunds.
func (e *insufficientFundsError) ErrorType() string { return ErrorTypeInsufficientFunds }

// gatewayTimeoutError is a gateway timeout: retryable, because the next attempt may pass.
type gatewayTimeoutError struct {
	PaymentID string
	// Attempt is the gateway's count of attempts for the payment, from 1; 0 when the
	// attempt never reached the gateway's decision (the caller's context ended first).
	Attempt int
	// Err is the caller's context error when that context ended first; otherwise nil.
	Err error
}

// Error names the payment and the attempt.
func (e *gatewayTimeoutError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("charge payment %q: gateway did not answer: %v", e.PaymentID, e.Err)
	}
	return fmt.Sprintf("charge payment %q: gateway timeout on attempt %d", e.PaymentID, e.Attempt)
}

// Unwrap returns the caller's context error, if that is what ended the attempt.
func (e *gatewayTimeoutError) Unwrap() error { return e.Err }

// ErrorType returns ErrorTypeGatewayTimeout.
func (e *gatewayTimeoutError) ErrorType() string { return ErrorTypeGatewayTimeout }

// rateLimitedError is the gateway's rate-limit refusal. Charge returns it wrapped in
// sluice.RetryAfter(RetryAfter, ...), so the retry step waits exactly that long.
type rateLimitedError struct {
	PaymentID  string
	RetryAfter time.Duration
}

// Error names the payment and the wait the gateway asked for.
func (e *rateLimitedError) Error() string {
	return fmt.Sprintf("charge payment %q: rate limited by gateway, retry after %s", e.PaymentID, e.RetryAfter)
}

// ErrorType returns paymentsim.ErrorTypeRateLimited.
func (e *rateLimitedError) ErrorType() string { return paymentsim.ErrorTypeRateLimited }

// Charge is one successful charge in the gateway's ledger.
type Charge struct {
	// ID is "ch_" and the gateway's sequence number of the charge.
	ID          string
	PaymentID   string
	OrderID     string
	AmountCents int64
	Currency    string
	Source      string
	// Attempt is the gateway's count of attempts for the payment when it was charged.
	Attempt int
}

// Gateway is a simulated card gateway that decides by the request's Source, the way card
// test tokens work (see the Token constants). It keeps, in memory, the number of attempts
// per payment ID, so tok_flaky_N and tok_rate_limited behave the same whatever headers a
// message carries, and a ledger of every successful charge.
//
// The gateway is deliberately not idempotent: charging a payment ID twice records two
// charges, so tests can prove that the stack's idempotency step is what prevents double
// charges (ChargeCount, TotalCharges). Its memory grows with every payment; it is a
// simulation, not a cache.
//
// The zero Gateway is ready to use. It is safe for concurrent use; set Latency before the
// first Charge.
type Gateway struct {
	// Latency is how long each Charge takes before the gateway decides, honouring the
	// caller's context. Zero answers at once. It makes the gateway visible in traces and
	// gives handler timeouts something to cut.
	Latency time.Duration

	// LedgerLimit bounds what the gateway remembers, for a long-running service: past
	// that many payments it forgets the oldest payment's attempts and charge count, and
	// Charges returns the last that many charges (it holds at most twice as many). Zero
	// remembers everything (tests).
	LedgerLimit int

	mu       sync.Mutex
	attempts map[string]int
	ledger   []Charge
	perID    map[string]int
	order    []string // payment ids in order of first attempt, when LedgerLimit is set
	total    int      // charges ever made
}

// NewGateway returns an empty gateway that answers at once.
func NewGateway() *Gateway { return &Gateway{} }

// Charge attempts to charge req and returns the recorded charge. The attempt is counted
// for req.PaymentID, then the source decides:
//
//   - paymentsim.TokenInsufficientFunds: sluice.Permanent(*insufficientFundsError);
//   - tok_flaky_N: attempts 1..N return a retryable *gatewayTimeoutError, later ones succeed;
//   - paymentsim.TokenTimeout: every attempt returns a retryable *gatewayTimeoutError;
//   - paymentsim.TokenRateLimited: attempt 1 returns sluice.RetryAfter(paymentsim.RateLimitRetryAfter,
//     *rateLimitedError), later ones succeed;
//   - paymentsim.TokenPanic: Charge panics, on every attempt;
//   - any other token: success.
//
// When ctx ends before the gateway decides (before the call, or during Latency), Charge
// returns a retryable *gatewayTimeoutError wrapping ctx.Err() and counts no attempt: the
// request never reached the gateway's decision.
func (g *Gateway) Charge(ctx context.Context, req Request) (Charge, error) {
	if err := g.wait(ctx); err != nil {
		return Charge{}, &gatewayTimeoutError{PaymentID: req.PaymentID, Err: err}
	}

	g.mu.Lock()
	if g.attempts == nil {
		g.attempts = make(map[string]int)
		g.perID = make(map[string]int)
	}
	if g.attempts[req.PaymentID] == 0 && g.LedgerLimit > 0 {
		g.order = append(g.order, req.PaymentID)
		if len(g.order) > g.LedgerLimit {
			oldest := g.order[0]
			g.order = g.order[1:]
			delete(g.attempts, oldest)
			delete(g.perID, oldest)
		}
	}
	g.attempts[req.PaymentID]++
	attempt := g.attempts[req.PaymentID]

	var err error
	switch source := req.Source; {
	case source == paymentsim.TokenPanic:
		// Unlock first: the panic must not leave the gateway locked for the next attempt.
		g.mu.Unlock()
		panic(fmt.Sprintf("example_payment: simulated gateway client crash charging payment %q (source %s, attempt %d)",
			req.PaymentID, source, attempt))
	case source == paymentsim.TokenInsufficientFunds:
		err = sluice.Permanent(&insufficientFundsError{PaymentID: req.PaymentID, AmountCents: req.AmountCents, Currency: req.Currency})
	case source == paymentsim.TokenTimeout:
		err = &gatewayTimeoutError{PaymentID: req.PaymentID, Attempt: attempt}
	case source == paymentsim.TokenRateLimited && attempt == 1:
		err = sluice.RetryAfter(paymentsim.RateLimitRetryAfter, &rateLimitedError{PaymentID: req.PaymentID, RetryAfter: paymentsim.RateLimitRetryAfter})
	case attempt <= paymentsim.FlakyFailures(source):
		err = &gatewayTimeoutError{PaymentID: req.PaymentID, Attempt: attempt}
	}
	if err != nil {
		g.mu.Unlock()
		return Charge{}, err
	}

	ch := Charge{
		ID:          fmt.Sprintf("ch_%08d", g.total+1),
		PaymentID:   req.PaymentID,
		OrderID:     req.OrderID,
		AmountCents: req.AmountCents,
		Currency:    req.Currency,
		Source:      req.Source,
		Attempt:     attempt,
	}
	g.total++
	g.ledger = append(g.ledger, ch)
	if g.LedgerLimit > 0 && len(g.ledger) >= 2*g.LedgerLimit {
		// Copy rather than reslice, so the forgotten charges are freed; and only once every
		// LedgerLimit charges, not at every charge: copying the whole ledger per charge
		// made each payment allocate LedgerLimit charges (2 MB at 20,000).
		g.ledger = append(make([]Charge, 0, 2*g.LedgerLimit), g.ledger[len(g.ledger)-g.LedgerLimit:]...)
	}
	g.perID[req.PaymentID]++
	g.mu.Unlock()
	return ch, nil
}

// wait returns ctx's error if ctx ends before Latency has passed.
func (g *Gateway) wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if g.Latency <= 0 {
		return nil
	}
	t := time.NewTimer(g.Latency)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Attempts returns how many attempts the gateway has decided for paymentID.
func (g *Gateway) Attempts(paymentID string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.attempts[paymentID]
}

// ChargeCount returns how many times paymentID has been charged. More than 1 is a double
// charge.
func (g *Gateway) ChargeCount(paymentID string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.perID[paymentID]
}

// TotalCharges returns the number of successful charges of all payments, forgotten ones
// included.
func (g *Gateway) TotalCharges() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.total
}

// Charges returns a copy of the ledger (the last LedgerLimit charges when it is set),
// oldest charge first.
func (g *Gateway) Charges() []Charge {
	g.mu.Lock()
	defer g.mu.Unlock()
	kept := g.ledger
	if g.LedgerLimit > 0 && len(kept) > g.LedgerLimit {
		kept = kept[len(kept)-g.LedgerLimit:]
	}
	return append([]Charge(nil), kept...)
}
