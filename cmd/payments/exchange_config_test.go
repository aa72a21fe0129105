package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadConfigExchanges(t *testing.T) {
	cases := []struct {
		name                             string
		exchange, bindingKey, out, parts string
		wantKey, wantOutput              string
		wantOpts                         int
		wantErr                          string
	}{
		{name: "unset: queues as before", wantKey: "payment.requested", wantOutput: "payments.succeeded"},
		{name: "subscribed with the default key", exchange: "orders", wantKey: "payment.requested", wantOutput: "payments.succeeded", wantOpts: 1},
		{name: "subscribed with a key of its own", exchange: "orders", bindingKey: "payment.#", wantKey: "payment.#", wantOutput: "payments.succeeded", wantOpts: 1},
		{name: "success events to an exchange", out: "payments", wantKey: "payment.requested", wantOutput: "", wantOpts: 1},
		{name: "both", exchange: "orders", out: "payments", wantKey: "payment.requested", wantOutput: "", wantOpts: 2},
		{name: "an exchange with partitions", exchange: "orders", parts: "4", wantErr: "PAYMENTS_EXCHANGE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PAYMENTS_EXCHANGE", tc.exchange)
			t.Setenv("PAYMENTS_BINDING_KEY", tc.bindingKey)
			t.Setenv("PAYMENTS_OUTPUT_EXCHANGE", tc.out)
			t.Setenv("PAYMENTS_PARTITIONS", tc.parts)
			t.Setenv("PAYMENTS_OUTPUT_QUEUE", "")
			cfg, err := loadConfig()
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantKey, cfg.bindingKey)
			output, opts := cfg.exchangeOptions()
			assert.Equal(t, tc.wantOutput, output)
			assert.Len(t, opts, tc.wantOpts)
		})
	}
}
