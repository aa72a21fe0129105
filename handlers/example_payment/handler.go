package example_payment

import (
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	sluice "github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
)

// The queues of the example.
const (
	// QueueRequested is the queue of payment requests the handler consumes.
	QueueRequested = "payments.requested"
	// QueueSucceeded is the queue the handler's Succeeded events are published to.
	QueueSucceeded = "payments.succeeded"
)

// metadataContentType is the metadata key of the content type.
const metadataContentType = "content-type"

// Succeeded is the event published to QueueSucceeded for each successful charge.
type Succeeded struct {
	PaymentID   string `json:"payment_id"`
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	// ChargeID is the gateway's ID of the charge.
	ChargeID string `json:"charge_id"`
	// Attempts is the delivery attempt that succeeded, counting from 1: the message's
	// x-retry-count plus one.
	Attempts int `json:"attempts"`
}

// Handler charges payment requests through a Gateway. Its Handle method is a plain
// watermill message.HandlerFunc; retries, dead-lettering, idempotency, tracing and the
// confirmed publish of its output are the stack's work, not the handler's.
type Handler struct {
	gateway *Gateway
}

// NewHandler returns a handler charging through g. It panics when g is nil, because a
// handler without a gateway could only fail every message.
func NewHandler(g *Gateway) *Handler {
	if g == nil {
		panic("example_payment: NewHandler called with a nil *Gateway")
	}
	return &Handler{gateway: g}
}

// Gateway returns the gateway the handler charges through.
func (h *Handler) Gateway() *Gateway { return h.gateway }

// Handle decodes the request, charges it and returns one Succeeded event (a new message
// with a new UUID, content-type application/json and the request's correlation id, if it
// has one) for QueueSucceeded.
//
// Its errors are the failure vocabulary of package sluice: a request that does not decode
// or validate is sluice.Permanent (see Decode); a gateway refusal is returned as the
// gateway classified it (see Gateway.Charge). With paymentsim.TokenPanic the handler panics, and the
// stack's recoverer turns that into an error like any other.
func (h *Handler) Handle(msg *message.Message) ([]*message.Message, error) {
	req, err := Decode(msg.Payload)
	if err != nil {
		return nil, err
	}
	charge, err := h.gateway.Charge(msg.Context(), req)
	if err != nil {
		return nil, err
	}
	payload, err := json.Marshal(Succeeded{
		PaymentID:   req.PaymentID,
		OrderID:     req.OrderID,
		AmountCents: req.AmountCents,
		Currency:    req.Currency,
		ChargeID:    charge.ID,
		Attempts:    sluice.RetryCount(msg.Metadata) + 1,
	})
	if err != nil {
		// Strings and integers always marshal; reaching this is a bug, not a bad message.
		return nil, fmt.Errorf("encode succeeded event for payment %q: %w", req.PaymentID, err)
	}
	out := message.NewMessage(watermill.NewUUID(), payload)
	out.Metadata.Set(metadataContentType, paymentsim.ContentTypeJSON)
	// The event belongs to the request's conversation, as Watermill's CorrelationID
	// middleware would say: whoever sent the request can find its events (the demo does).
	if id := middleware.MessageCorrelationID(msg); id != "" {
		middleware.SetCorrelationID(id, out)
	}
	return []*message.Message{out}, nil
}

// KeyFunc returns the payment ID of a request message: the key the stack's idempotency
// step uses (router.WithIdempotencyKey(example_payment.KeyFunc)), so a payment requested
// twice is charged once. A message that does not decode or validate has no key; the error
// is Decode's, permanent, and the message is dead-lettered as the handler would have done.
func KeyFunc(msg *message.Message) (string, error) {
	req, err := Decode(msg.Payload)
	if err != nil {
		return "", err
	}
	return req.PaymentID, nil
}
