package example_payment_test

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	sluice "github.com/sluice-go/sluice"
	ep "github.com/sluice-go/sluice/handlers/example_payment"
)

// The handler on its own, without a broker: a flaky card times out once, and the stack
// (played here by hand) delivers the message again with x-retry-count 1.
func Example() {
	h := ep.NewHandler(ep.NewGateway())
	msg := message.NewMessage(watermill.NewUUID(), []byte(
		`{"payment_id":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"EUR","source":"tok_flaky_1"}`))

	_, err := h.Handle(msg)
	fmt.Println("attempt 1:", sluice.ClassOf(err), sluice.ErrorType(err))

	msg.Metadata.Set(sluice.HeaderRetryCount, "1")
	out, err := h.Handle(msg)
	fmt.Println("attempt 2:", err, string(out[0].Payload))
	// Output:
	// attempt 1: retryable gateway_timeout
	// attempt 2: <nil> {"payment_id":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"EUR","charge_id":"ch_00000001","attempts":2}
}

func ExampleDecode() {
	_, err := ep.Decode([]byte(`{"payment_id":"pay_1","order_id":"ord_1","amount_cents":"12.99","currency":"EUR","source":"tok_visa"}`))
	fmt.Println(sluice.ClassOf(err), sluice.ErrorType(err))
	fmt.Println(err)
	// Output:
	// permanent validation
	// permanent: invalid payment request: field "amount_cents" is "12.99": must be a JSON integer number of cents, not a string
}
