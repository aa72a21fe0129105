package example_payment_test

import (
	"encoding/json"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sluice "github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/handlers/example_payment"
)

// BuildFailed turns a request and its failure record into payment.failed; a request with
// no order to compensate builds none, and the stack dead-letters it alone.
func TestBuildFailed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		want    example_payment.Failed
		wantErr bool
	}{
		{name: "retries exhausted", body: `{"payment_id":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"EUR","source":"tok_timeout"}`,
			want: example_payment.Failed{PaymentID: "pay_1", OrderID: "ord_1", AmountCents: 1299, Currency: "EUR",
				ErrorType: "gateway_timeout", Reason: "retries_exhausted", Attempts: 6}},
		{name: "not a request", body: `{"payment_id":`, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := message.NewMessage("m1", []byte(tc.body))
			msg.Metadata.Set(sluice.HeaderRetryCount, "5")
			record := message.NewMessage("m1", []byte(tc.body))
			record.Metadata.Set(sluice.HeaderLastError, "gateway_timeout")
			record.Metadata.Set("x-dead-letter-reason", "retries_exhausted")
			ev, err := example_payment.BuildFailed(msg, record)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			var got example_payment.Failed
			require.NoError(t, json.Unmarshal(ev.Payload, &got))
			assert.Equal(t, tc.want, got)
		})
	}
}
