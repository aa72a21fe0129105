package example_payment

import (
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	sluice "github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
)

// QueueFailed is the queue of the Failed events a payment that finally fails publishes as
// its compensation (router.WithCompensation with BuildFailed): the order side cancels the
// order (package example_order).
const QueueFailed = "payments.failed"

// headerDeadLetterReason is the failure record's header saying why sluice stopped trying.
const headerDeadLetterReason = "x-dead-letter-reason"

// Failed is the compensation event of a payment request whose fate is final: its retries
// ran out, or its failure was permanent. The stack publishes it beside the dead letter,
// with a deterministic id (the same on every redelivery) that consumers deduplicate by.
type Failed struct {
	PaymentID   string `json:"payment_id"`
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	// ErrorType is the type of the last error (the failure record's x-last-error), such
	// as "gateway_timeout" or "insufficient_funds".
	ErrorType string `json:"error_type"`
	// Reason is why sluice stopped trying (the record's x-dead-letter-reason), such as
	// "retries_exhausted" or "permanent".
	Reason string `json:"reason"`
	// Attempts is how many attempts were made, counting from 1.
	Attempts int `json:"attempts"`
}

// BuildFailed is the payment handler's router.Compensation Build function: the Failed
// event of request msg, whose failure record is record. A request that does not decode
// has no order to compensate: BuildFailed returns Decode's error, and the stack
// dead-letters it without a compensation (its record says why).
func BuildFailed(msg, record *message.Message) (*message.Message, error) {
	req, err := Decode(msg.Payload)
	if err != nil {
		return nil, fmt.Errorf("no payment.failed for an undecodable request: %w", err)
	}
	payload, err := json.Marshal(Failed{
		PaymentID:   req.PaymentID,
		OrderID:     req.OrderID,
		AmountCents: req.AmountCents,
		Currency:    req.Currency,
		ErrorType:   record.Metadata.Get(sluice.HeaderLastError),
		Reason:      record.Metadata.Get(headerDeadLetterReason),
		Attempts:    sluice.RetryCount(msg.Metadata) + 1,
	})
	if err != nil {
		return nil, fmt.Errorf("encode payment.failed for payment %q: %w", req.PaymentID, err)
	}
	// The stack replaces this id with the deterministic compensation id.
	out := message.NewMessage(watermill.NewUUID(), payload)
	out.Metadata.Set(metadataContentType, paymentsim.ContentTypeJSON)
	return out, nil
}
