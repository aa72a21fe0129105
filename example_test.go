package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
)

// CardExpiredError is a domain error that names its own type for failure records and metrics.
type CardExpiredError struct{ Card string }

func (e CardExpiredError) Error() string     { return "card " + e.Card + " expired" }
func (e CardExpiredError) ErrorType() string { return "card_expired" }

// A handler says what should become of a failed message through the error it returns:
// a plain error is retried, Permanent goes to the dead-letter queue at once, Discard is
// acked and logged, RetryAfter and Defer choose the wait. The error type is what
// operators filter on (`sluice dlq replay --error-type`).
func Example() {
	for _, err := range []error{
		errors.New("gateway timeout"),
		sluice.Permanent(CardExpiredError{Card: "4242"}),
		sluice.Discard(errors.New("event for a deleted account")),
		sluice.RetryAfter(30*time.Second, errors.New("rate limited")),
		sluice.Defer(time.Minute, errors.New("settlement window not open")),
		fmt.Errorf("charge: %w", context.DeadlineExceeded),
	} {
		fmt.Printf("%-9s %-17s %s\n", sluice.ClassOf(err), sluice.ErrorType(err), sluice.ErrorMessage(err))
	}
	// Output:
	// retryable error             gateway timeout
	// permanent card_expired      permanent: card 4242 expired
	// discard   error             discard: event for a deleted account
	// retryable error             retry after 30s: rate limited
	// defer     error             deferred for 1m0s: settlement window not open
	// retryable deadline_exceeded charge: context deadline exceeded
}

// A sentinel error gets a stable name once, at start-up, instead of the generic "error".
func ExampleRegisterErrorType() {
	errInsufficientFunds := errors.New("insufficient funds")
	fmt.Println(sluice.ErrorType(errInsufficientFunds))
	sluice.RegisterErrorType(errInsufficientFunds, "insufficient_funds")
	fmt.Println(sluice.ErrorType(fmt.Errorf("charge pay-1: %w", errInsufficientFunds)))
	// Output:
	// error
	// insufficient_funds
}

// RetryCount reads x-retry-count, which the retry step sets on every retried copy: the
// attempt number is the count plus one. A missing or garbled header counts as zero.
func ExampleRetryCount() {
	msg := message.NewMessage("pay-1", nil)
	fmt.Println("attempt", sluice.RetryCount(msg.Metadata)+1)
	msg.Metadata.Set(sluice.HeaderRetryCount, "2")
	fmt.Println("attempt", sluice.RetryCount(msg.Metadata)+1)
	// Output:
	// attempt 1
	// attempt 3
}
