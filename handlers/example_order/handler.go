package example_order

import (
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	sluice "github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
)

// The queues of the order side; the payment side's are example_payment's.
const (
	// QueueCreated is the queue of order.created events Handler.Create consumes.
	QueueCreated = "orders.created"
	// QueueOutcomes is the queue of the Outcome events Paid and Cancel publish.
	QueueOutcomes = "orders.outcomes"
)

// metadataContentType is the metadata key of the content type.
const metadataContentType = "content-type"

// Outcome is the event of an order's end state, published to QueueOutcomes with the id
// OutcomeID(OrderID, Status): a redelivery publishes it again with the same id, so its
// consumers deduplicate by id.
type Outcome struct {
	OrderID   string `json:"order_id"`
	PaymentID string `json:"payment_id"`
	Status    Status `json:"status"`
	// ChargeID is the gateway's charge, when paid.
	ChargeID string `json:"charge_id,omitempty"`
	// ErrorType and Reason say why the payment failed, when cancelled.
	ErrorType string `json:"error_type,omitempty"`
	Reason    string `json:"reason,omitempty"`
}

// OutcomeID is the message id of the Outcome of order orderID ending in status.
func OutcomeID(orderID string, status Status) string {
	return "order/" + orderID + "/" + string(status)
}

// PaymentRequestID is the message id of the payment request Create publishes for the
// order.created message createdID: the same on every redelivery.
func PaymentRequestID(createdID string) string { return createdID + "/payment" }

// Options are the handler's hooks, for a demo or a test to watch; the zero value has none.
type Options struct {
	// OnDuplicate, when set, is called with the order of an order.created whose order id
	// the book knows from another message.
	OnDuplicate func(o Order)
	// OnOutcome, when set, is called by Paid and Cancel with each payment event msg they
	// decode, the state it asks for (StatusPaid or StatusCancelled) and the order after
	// it: the zero Order when the book does not know the order.
	OnOutcome func(msg *message.Message, asked Status, o Order)
}

// Handler is the order side of the saga; its methods are watermill handler functions
// (see the package doc for what each consumes and publishes).
type Handler struct {
	book *Book
	opts Options
}

// NewHandler returns a handler keeping its orders in book. It panics when book is nil.
func NewHandler(book *Book, opts Options) *Handler {
	if book == nil {
		panic("example_order: NewHandler called with a nil *Book")
	}
	return &Handler{book: book, opts: opts}
}

// Book returns the handler's order book.
func (h *Handler) Book() *Book { return h.book }

// Create consumes an order.created event: the checkout, the same JSON object as a payment
// request (example_payment.Request; invalid ones are permanent errors, as Decode says). A
// new order is recorded pending and its payment request returned, for
// example_payment.QueueRequested; so is the request of an order created by this very
// message (a redelivery). Another message for a known order returns nothing.
func (h *Handler) Create(msg *message.Message) ([]*message.Message, error) {
	req, err := example_payment.Decode(msg.Payload)
	if err != nil {
		return nil, err
	}
	o, created, err := h.book.create(Order{ID: req.OrderID, PaymentID: req.PaymentID, CreatedBy: msg.UUID})
	if err != nil {
		return nil, err
	}
	if !created && o.CreatedBy != msg.UUID {
		if h.opts.OnDuplicate != nil {
			h.opts.OnDuplicate(o)
		}
		return nil, nil
	}
	if !created && o.Status == StatusCancelled {
		return nil, nil // its payment gave up: asking again could charge a cancelled order
	}
	payload, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode payment request of order %q: %w", req.OrderID, err)
	}
	return []*message.Message{event(msg, PaymentRequestID(msg.UUID), payload)}, nil
}

// Paid consumes an example_payment.Succeeded event and marks its order paid.
func (h *Handler) Paid(msg *message.Message) ([]*message.Message, error) {
	var ev example_payment.Succeeded
	if err := decodeEvent(msg, &ev); err != nil {
		return nil, err
	}
	return h.settle(msg, ev.OrderID, StatusPaid, Outcome{ChargeID: ev.ChargeID})
}

// Cancel consumes an example_payment.Failed event, the payment's compensation, and
// cancels its order.
func (h *Handler) Cancel(msg *message.Message) ([]*message.Message, error) {
	var ev example_payment.Failed
	if err := decodeEvent(msg, &ev); err != nil {
		return nil, err
	}
	return h.settle(msg, ev.OrderID, StatusCancelled, Outcome{ErrorType: ev.ErrorType, Reason: ev.Reason})
}

// decodeEvent decodes msg's payload into ev; a body that is not a JSON object is permanent.
func decodeEvent(msg *message.Message, ev any) error {
	if err := json.Unmarshal(msg.Payload, ev); err != nil {
		return sluice.Permanent(fmt.Errorf("decode payment event %s: %w", msg.UUID, err))
	}
	return nil
}

// settle moves the order to status and returns its Outcome when that is its state: the
// first outcome wins. An event naming no order, or one the book does not know, returns
// nothing.
func (h *Handler) settle(msg *message.Message, orderID string, status Status, out Outcome) ([]*message.Message, error) {
	var o Order
	known := false
	if orderID != "" {
		var err error
		if o, known, err = h.book.settle(orderID, status); err != nil {
			return nil, err
		}
	}
	if h.opts.OnOutcome != nil {
		h.opts.OnOutcome(msg, status, o)
	}
	if !known {
		return nil, nil
	}
	if o.Status != status {
		return nil, nil // a conflict: the book counted it
	}
	out.OrderID, out.PaymentID, out.Status = o.ID, o.PaymentID, o.Status
	payload, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode outcome of order %q: %w", o.ID, err)
	}
	return []*message.Message{event(msg, OutcomeID(o.ID, status), payload)}, nil
}

// event is an output message of msg: JSON, in msg's conversation (its correlation id).
func event(msg *message.Message, id string, payload []byte) *message.Message {
	out := message.NewMessage(id, payload)
	out.Metadata.Set(metadataContentType, paymentsim.ContentTypeJSON)
	if c := middleware.MessageCorrelationID(msg); c != "" {
		middleware.SetCorrelationID(c, out)
	}
	return out
}
