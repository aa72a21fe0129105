package example_order_test

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sluice "github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/handlers/example_order"
	"github.com/sluice-go/sluice/handlers/example_payment"
)

func created(t *testing.T, id, orderID string) *message.Message {
	t.Helper()
	body, err := json.Marshal(example_payment.Request{PaymentID: "pay_" + orderID, OrderID: orderID, AmountCents: 1299, Currency: "EUR", Source: "tok_visa"})
	require.NoError(t, err)
	m := message.NewMessage(id, body)
	middleware.SetCorrelationID("conv-1", m)
	return m
}

func succeeded(t *testing.T, orderID string) *message.Message {
	t.Helper()
	body, err := json.Marshal(example_payment.Succeeded{PaymentID: "pay_" + orderID, OrderID: orderID, ChargeID: "ch_1", Attempts: 1})
	require.NoError(t, err)
	return message.NewMessage("s-"+orderID, body)
}

func failed(t *testing.T, orderID string) *message.Message {
	t.Helper()
	body, err := json.Marshal(example_payment.Failed{PaymentID: "pay_" + orderID, OrderID: orderID, ErrorType: "gateway_timeout", Reason: "retries_exhausted"})
	require.NoError(t, err)
	return message.NewMessage("f-"+orderID, body)
}

// ids returns the ids of msgs.
func ids(msgs []*message.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.UUID)
	}
	return out
}

// The saga's rules, event by event: one payment request per order, the first outcome wins,
// redeliveries publish the same message again, duplicates and contradictions publish nothing.
func TestHandler_EveryOrderEndsOnce(t *testing.T) {
	type step struct {
		handle string // create, paid, cancel
		msgID  string // for create
		want   []string
	}
	for _, tc := range []struct {
		name       string
		steps      []step
		status     example_order.Status
		duplicates int
		conflicts  int
	}{
		{name: "paid", status: example_order.StatusPaid, steps: []step{
			{handle: "create", msgID: "c1", want: []string{"c1/payment"}},
			{handle: "paid", want: []string{"order/o1/paid"}},
		}},
		{name: "cancelled by the payment's compensation", status: example_order.StatusCancelled, steps: []step{
			{handle: "create", msgID: "c1", want: []string{"c1/payment"}},
			{handle: "cancel", want: []string{"order/o1/cancelled"}},
		}},
		{name: "redeliveries publish the same messages again", status: example_order.StatusPaid, steps: []step{
			{handle: "create", msgID: "c1", want: []string{"c1/payment"}},
			{handle: "create", msgID: "c1", want: []string{"c1/payment"}},
			{handle: "paid", want: []string{"order/o1/paid"}},
			{handle: "paid", want: []string{"order/o1/paid"}},
		}},
		{name: "a second order.created is a duplicate", status: example_order.StatusPending, duplicates: 1, steps: []step{
			{handle: "create", msgID: "c1", want: []string{"c1/payment"}},
			{handle: "create", msgID: "c2"},
		}},
		{name: "a paid order is never cancelled", status: example_order.StatusPaid, conflicts: 1, steps: []step{
			{handle: "create", msgID: "c1", want: []string{"c1/payment"}},
			{handle: "paid", want: []string{"order/o1/paid"}},
			{handle: "cancel"},
		}},
		{name: "a cancelled order is never paid, nor asked to pay again", status: example_order.StatusCancelled, conflicts: 1, steps: []step{
			{handle: "create", msgID: "c1", want: []string{"c1/payment"}},
			{handle: "cancel", want: []string{"order/o1/cancelled"}},
			{handle: "paid"},
			{handle: "create", msgID: "c1"},
		}},
		{name: "an outcome for an unknown order is ignored", steps: []step{
			{handle: "paid"}, {handle: "cancel"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dups := 0
			h := example_order.NewHandler(example_order.NewBook(), example_order.Options{OnDuplicate: func(example_order.Order) { dups++ }})
			for i, s := range tc.steps {
				var out []*message.Message
				var err error
				switch s.handle {
				case "create":
					out, err = h.Create(created(t, s.msgID, "o1"))
				case "paid":
					out, err = h.Paid(succeeded(t, "o1"))
				case "cancel":
					out, err = h.Cancel(failed(t, "o1"))
				}
				require.NoError(t, err, "step %d", i)
				assert.Equal(t, s.want, ids(out), "step %d (%s)", i, s.handle)
			}
			o, known := h.Book().Order("o1")
			if tc.status == "" {
				assert.False(t, known)
			} else {
				assert.Equal(t, tc.status, o.Status)
			}
			assert.Equal(t, tc.duplicates, dups, "duplicates")
			assert.Equal(t, tc.conflicts, h.Book().Conflicts(), "conflicts")
		})
	}
}

// The payment request carries the checkout and the conversation; the outcome says why.
func TestHandler_Events(t *testing.T) {
	h := example_order.NewHandler(example_order.NewBook(), example_order.Options{})
	out, err := h.Create(created(t, "c1", "o1"))
	require.NoError(t, err)
	require.Len(t, out, 1)
	req, err := example_payment.Decode(out[0].Payload)
	require.NoError(t, err)
	assert.Equal(t, "pay_o1", req.PaymentID)
	assert.Equal(t, "conv-1", middleware.MessageCorrelationID(out[0]))

	out, err = h.Cancel(failed(t, "o1"))
	require.NoError(t, err)
	require.Len(t, out, 1)
	var oc example_order.Outcome
	require.NoError(t, json.Unmarshal(out[0].Payload, &oc))
	assert.Equal(t, example_order.Outcome{OrderID: "o1", PaymentID: "pay_o1", Status: example_order.StatusCancelled,
		ErrorType: "gateway_timeout", Reason: "retries_exhausted"}, oc)
}

// An outcome event naming no order (a payment requested without one) is ignored; the hook
// still sees it, so a demo can tell an earlier run's events from its own.
func TestHandler_OutcomeWithoutOrder(t *testing.T) {
	var asked []example_order.Status
	h := example_order.NewHandler(example_order.NewBook(), example_order.Options{
		OnOutcome: func(_ *message.Message, s example_order.Status, o example_order.Order) {
			asked = append(asked, s)
			assert.Empty(t, o.ID)
		},
	})
	out, err := h.Paid(message.NewMessage("s", []byte(`{"payment_id":"pay_stale_1","attempts":1}`)))
	require.NoError(t, err)
	assert.Empty(t, out)
	out, err = h.Cancel(failed(t, "unknown"))
	require.NoError(t, err)
	assert.Empty(t, out)
	assert.Equal(t, []example_order.Status{example_order.StatusPaid, example_order.StatusCancelled}, asked)
}

// Bodies that are not their events are permanent failures: no retry can fix them.
func TestHandler_BadBodiesArePermanent(t *testing.T) {
	h := example_order.NewHandler(example_order.NewBook(), example_order.Options{})
	for name, handle := range map[string]func(*message.Message) ([]*message.Message, error){
		"create": h.Create, "paid": h.Paid, "cancel": h.Cancel,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := handle(message.NewMessage("x", []byte(`{"order_id":`)))
			require.Error(t, err)
			assert.Equal(t, sluice.ClassPermanent, sluice.ClassOf(err), "%v", err)
		})
	}
}

// A book in a file comes back with its orders after the process ends, so a redelivered
// event finds the order's state (the contract test SIGKILLs the service).
func TestOpenBook_Reopens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "orders.jsonl")
	b, err := example_order.OpenBook(path)
	require.NoError(t, err)
	h := example_order.NewHandler(b, example_order.Options{})
	for _, o := range []string{"o1", "o2", "o3"} {
		_, err := h.Create(created(t, "c-"+o, o))
		require.NoError(t, err)
	}
	_, err = h.Paid(succeeded(t, "o1"))
	require.NoError(t, err)
	_, err = h.Cancel(failed(t, "o2"))
	require.NoError(t, err)
	require.NoError(t, b.Close())

	b, err = example_order.OpenBook(path)
	require.NoError(t, err)
	defer b.Close()
	for id, want := range map[string]example_order.Status{"o1": example_order.StatusPaid, "o2": example_order.StatusCancelled, "o3": example_order.StatusPending} {
		o, ok := b.Order(id)
		require.True(t, ok, id)
		assert.Equal(t, want, o.Status, id)
	}
	assert.Equal(t, 1, b.Count(example_order.StatusPaid))
	out, err := example_order.NewHandler(b, example_order.Options{}).Cancel(failed(t, "o1"))
	require.NoError(t, err)
	assert.Empty(t, out, "o1 was paid before the restart")
}
