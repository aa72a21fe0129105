package example_payment_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sluice "github.com/sluice-go/sluice"
	ep "github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
	"github.com/sluice-go/sluice/internal/markers"
)

func request(paymentID, source string) ep.Request {
	return ep.Request{PaymentID: paymentID, OrderID: "ord_" + paymentID, AmountCents: 1299, Currency: "EUR", Source: source}
}

// step is what one gateway attempt must return: "" for success, else the error type.
type step struct {
	errType string
	class   sluice.Class
}

var (
	ok          = step{}
	timeout     = step{errType: ep.ErrorTypeGatewayTimeout, class: sluice.ClassRetryable}
	declined    = step{errType: ep.ErrorTypeInsufficientFunds, class: sluice.ClassPermanent}
	rateLimited = step{errType: paymentsim.ErrorTypeRateLimited, class: sluice.ClassRetryable}
)

func TestGateway_ChargeByToken(t *testing.T) {
	tests := []struct {
		source string
		steps  []step // consecutive attempts for one payment ID
	}{
		{source: "tok_visa", steps: []step{ok, ok}},
		{source: "tok_mastercard", steps: []step{ok}},
		{source: paymentsim.TokenInsufficientFunds, steps: []step{declined, declined, declined}},
		{source: paymentsim.TokenTimeout, steps: []step{timeout, timeout, timeout, timeout, timeout, timeout, timeout, timeout, timeout, timeout, timeout}},
		{source: paymentsim.TokenRateLimited, steps: []step{rateLimited, ok, ok}},
		{source: paymentsim.FlakyToken(1), steps: []step{timeout, ok, ok}},
		{source: paymentsim.FlakyToken(2), steps: []step{timeout, timeout, ok}},
		{source: paymentsim.FlakyToken(5), steps: []step{timeout, timeout, timeout, timeout, timeout, ok}},
		{source: paymentsim.FlakyToken(9), steps: []step{timeout, timeout, timeout, timeout, timeout, timeout, timeout, timeout, timeout, ok}},
		// Only one digit 1..9 makes a flaky token; anything else is an ordinary token.
		{source: "tok_flaky_0", steps: []step{ok}},
		{source: "tok_flaky_10", steps: []step{ok}},
		{source: "tok_flaky_01", steps: []step{ok}},
		{source: "tok_flaky_", steps: []step{ok}},
		{source: "tok_flaky_x", steps: []step{ok}},
		{source: "TOK_TIMEOUT", steps: []step{ok}},
	}
	for _, tt := range tests {
		t.Run(tt.source, func(t *testing.T) {
			g := ep.NewGateway()
			req := request("pay_1", tt.source)
			wantCharges := 0
			for i, want := range tt.steps {
				attempt := i + 1
				ch, err := g.Charge(context.Background(), req)
				assert.Equal(t, attempt, g.Attempts(req.PaymentID), "attempt %d", attempt)
				if want == ok {
					require.NoError(t, err, "attempt %d", attempt)
					wantCharges++
					assert.Equal(t, req.PaymentID, ch.PaymentID)
					assert.Equal(t, req.OrderID, ch.OrderID)
					assert.Equal(t, req.AmountCents, ch.AmountCents)
					assert.Equal(t, req.Currency, ch.Currency)
					assert.Equal(t, req.Source, ch.Source)
					assert.Equal(t, attempt, ch.Attempt)
					assert.Regexp(t, `^ch_\d{8}$`, ch.ID)
				} else {
					require.Error(t, err, "attempt %d", attempt)
					assert.Equal(t, ep.Charge{}, ch)
					assert.Equal(t, want.errType, sluice.ErrorType(err), "attempt %d: %v", attempt, err)
					assert.Equal(t, want.class, sluice.ClassOf(err), "attempt %d: %v", attempt, err)
					assert.Contains(t, err.Error(), req.PaymentID, "the error names the payment")
				}
				assert.Equal(t, wantCharges, g.ChargeCount(req.PaymentID), "attempt %d", attempt)
			}
			assert.Equal(t, wantCharges, g.TotalCharges())
		})
	}
}

func TestGateway_RateLimitedRetryAfter(t *testing.T) {
	g := ep.NewGateway()
	_, err := g.Charge(context.Background(), request("pay_rl", paymentsim.TokenRateLimited))
	require.Error(t, err)

	var ra *markers.RetryAfter
	require.ErrorAs(t, err, &ra)
	assert.Equal(t, 2*time.Second, ra.After)
	var rl *ep.RateLimitedError
	require.ErrorAs(t, err, &rl)
	assert.Equal(t, 2*time.Second, rl.RetryAfter)
	assert.Equal(t, "pay_rl", rl.PaymentID)
}

func TestGateway_InsufficientFundsError(t *testing.T) {
	g := ep.NewGateway()
	_, err := g.Charge(context.Background(), request("pay_nsf", paymentsim.TokenInsufficientFunds))
	var nsf *ep.InsufficientFundsError
	require.ErrorAs(t, err, &nsf)
	assert.Equal(t, ep.InsufficientFundsError{PaymentID: "pay_nsf", AmountCents: 1299, Currency: "EUR"}, *nsf)
	assert.Contains(t, err.Error(), "insufficient funds for 1299 EUR")
}

func TestGateway_PanicToken(t *testing.T) {
	g := ep.NewGateway()
	req := request("pay_p", paymentsim.TokenPanic)
	for attempt := 1; attempt <= 3; attempt++ {
		assert.PanicsWithValue(t,
			fmt.Sprintf(`example_payment: simulated gateway client crash charging payment "pay_p" (source tok_panic, attempt %d)`, attempt),
			func() { _, _ = g.Charge(context.Background(), req) })
		assert.Equal(t, attempt, g.Attempts("pay_p"))
	}
	// The panic released the gateway's lock: other payments still go through.
	_, err := g.Charge(context.Background(), request("pay_after", "tok_visa"))
	require.NoError(t, err)
	assert.Equal(t, 0, g.ChargeCount("pay_p"))
	assert.Equal(t, 1, g.TotalCharges())
}

func TestGateway_AttemptsArePerPayment(t *testing.T) {
	g := ep.NewGateway()
	_, err := g.Charge(context.Background(), request("pay_a", paymentsim.FlakyToken(1)))
	require.Error(t, err)
	// Another payment with the same token starts its own count.
	_, err = g.Charge(context.Background(), request("pay_b", paymentsim.FlakyToken(1)))
	require.Error(t, err)
	_, err = g.Charge(context.Background(), request("pay_a", paymentsim.FlakyToken(1)))
	require.NoError(t, err)
	assert.Equal(t, 2, g.Attempts("pay_a"))
	assert.Equal(t, 1, g.Attempts("pay_b"))
	assert.Equal(t, 0, g.Attempts("pay_unknown"))
}

func TestGateway_LedgerIsNotIdempotent(t *testing.T) {
	var g ep.Gateway // the zero value is ready to use
	first, err := g.Charge(context.Background(), request("pay_1", "tok_visa"))
	require.NoError(t, err)
	second, err := g.Charge(context.Background(), request("pay_1", "tok_visa"))
	require.NoError(t, err)
	other, err := g.Charge(context.Background(), request("pay_2", "tok_amex"))
	require.NoError(t, err)

	assert.Equal(t, "ch_00000001", first.ID)
	assert.Equal(t, "ch_00000002", second.ID)
	assert.Equal(t, "ch_00000003", other.ID)
	assert.Equal(t, 2, g.ChargeCount("pay_1"), "a second charge of the same payment is recorded: a double charge")
	assert.Equal(t, 1, g.ChargeCount("pay_2"))
	assert.Equal(t, 0, g.ChargeCount("pay_3"))
	assert.Equal(t, 3, g.TotalCharges())
	assert.Equal(t, []ep.Charge{first, second, other}, g.Charges())

	// Charges returns a copy.
	charges := g.Charges()
	charges[0].ID = "changed"
	assert.Equal(t, "ch_00000001", g.Charges()[0].ID)
}

func TestGateway_ContextEnded(t *testing.T) {
	tests := []struct {
		name    string
		latency time.Duration
		ctx     func() (context.Context, context.CancelFunc)
		wantErr error
	}{
		{
			name: "cancelled before the call",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			},
			wantErr: context.Canceled,
		},
		{
			name:    "deadline during latency",
			latency: time.Hour,
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 10*time.Millisecond)
			},
			wantErr: context.DeadlineExceeded,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &ep.Gateway{Latency: tt.latency}
			ctx, cancel := tt.ctx()
			defer cancel()
			_, err := g.Charge(ctx, request("pay_ctx", "tok_visa"))
			require.ErrorIs(t, err, tt.wantErr)
			assert.Equal(t, ep.ErrorTypeGatewayTimeout, sluice.ErrorType(err))
			assert.Equal(t, sluice.ClassRetryable, sluice.ClassOf(err))
			var gt *ep.GatewayTimeoutError
			require.ErrorAs(t, err, &gt)
			assert.Equal(t, 0, gt.Attempt)
			assert.Equal(t, 0, g.Attempts("pay_ctx"), "an attempt that never reached the decision is not counted")
			assert.Equal(t, 0, g.TotalCharges())
		})
	}
}

func TestGateway_LatencyThenCharge(t *testing.T) {
	g := &ep.Gateway{Latency: time.Millisecond}
	ch, err := g.Charge(context.Background(), request("pay_slow", "tok_visa"))
	require.NoError(t, err)
	assert.Equal(t, 1, ch.Attempt)
}

func TestGateway_Concurrent(t *testing.T) {
	const payments, copies = 20, 5
	g := ep.NewGateway()
	var wg sync.WaitGroup
	errs := make(chan error, payments*copies)
	for p := 0; p < payments; p++ {
		for c := 0; c < copies; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				source := "tok_visa"
				if p%2 == 1 {
					source = paymentsim.FlakyToken(2)
				}
				_, err := g.Charge(context.Background(), request(fmt.Sprintf("pay_%d", p), source))
				errs <- err
			}()
		}
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if err != nil {
			failed++
			assert.Equal(t, ep.ErrorTypeGatewayTimeout, sluice.ErrorType(err), "unexpected error %v", err)
		}
	}
	// Every flaky payment fails exactly its first two attempts, whatever the interleaving.
	assert.Equal(t, payments/2*2, failed)
	assert.Equal(t, payments*copies-failed, g.TotalCharges())
	ids := map[string]bool{}
	for _, ch := range g.Charges() {
		assert.False(t, ids[ch.ID], "charge ID %s issued twice", ch.ID)
		ids[ch.ID] = true
	}
	for p := 0; p < payments; p++ {
		id := fmt.Sprintf("pay_%d", p)
		assert.Equal(t, copies, g.Attempts(id))
	}
}

func TestFlakyToken(t *testing.T) {
	assert.Equal(t, "tok_flaky_3", paymentsim.FlakyToken(3))
}

func TestGateway_LedgerLimitBoundsMemory(t *testing.T) {
	g := &ep.Gateway{LedgerLimit: 3}
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		_, err := g.Charge(ctx, ep.Request{PaymentID: fmt.Sprintf("p%d", i), OrderID: "o", AmountCents: 1, Currency: "EUR", Source: "tok_visa"})
		require.NoError(t, err)
	}
	assert.Equal(t, 10, g.TotalCharges(), "every charge is counted")
	charges := g.Charges()
	require.Len(t, charges, 3, "only the last LedgerLimit charges are kept")
	assert.Equal(t, "p9", charges[2].PaymentID)
	assert.Equal(t, "ch_00000010", charges[2].ID, "charge ids keep counting")
	assert.Equal(t, 1, g.ChargeCount("p9"), "recent payments are remembered")
	assert.Zero(t, g.ChargeCount("p0"), "the oldest payments are forgotten")
	assert.Zero(t, g.Attempts("p0"))
}

// A long-running service charges far past LedgerLimit: a charge must cost the same then,
// not a copy of the whole ledger (which made every payment allocate megabytes).
func TestGateway_ChargePastTheLedgerLimitDoesNotCopyTheLedger(t *testing.T) {
	const limit = 2000
	g := &ep.Gateway{LedgerLimit: limit}
	ctx := context.Background()
	charge := func(i int) {
		_, err := g.Charge(ctx, ep.Request{PaymentID: fmt.Sprintf("p%d", i), OrderID: "o", AmountCents: 1, Currency: "EUR", Source: "tok_visa"})
		require.NoError(t, err)
	}
	for i := 0; i < 3*limit; i++ {
		charge(i)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 3 * limit; i < 7*limit; i++ {
		charge(i)
	}
	runtime.ReadMemStats(&after)
	perCharge := float64(after.TotalAlloc-before.TotalAlloc) / (4 * limit)
	// A charge is about a hundred bytes; the trims amortize to one more charge each. A
	// copy per charge would be limit charges, some 200 KB here.
	assert.Less(t, perCharge, 2048.0, "bytes allocated per charge past the limit")
	charges := g.Charges()
	require.Len(t, charges, limit)
	assert.Equal(t, fmt.Sprintf("p%d", 7*limit-1), charges[limit-1].PaymentID, "the newest charge is last")
	assert.Equal(t, fmt.Sprintf("p%d", 6*limit), charges[0].PaymentID, "the last LedgerLimit charges are kept")
}
