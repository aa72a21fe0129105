package idempotency_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/middleware/idempotency"
)

func TestConfig_Validate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     idempotency.Config
		wantErr string
	}{
		{name: "zero config takes defaults", cfg: idempotency.Config{}},
		{name: "explicit values", cfg: idempotency.Config{TTL: time.Hour, MaxKeys: 10, Lease: time.Second, InFlightDeferral: time.Millisecond}},
		{name: "negative TTL", cfg: idempotency.Config{TTL: -time.Second}, wantErr: "TTL -1s is below 1ms"},
		{name: "TTL below a millisecond", cfg: idempotency.Config{TTL: time.Microsecond}, wantErr: "TTL 1µs is below 1ms"},
		{name: "negative MaxKeys", cfg: idempotency.Config{MaxKeys: -1}, wantErr: "MaxKeys -1 is below 1"},
		{name: "MaxKeys too large", cfg: idempotency.Config{MaxKeys: idempotency.MaxMaxKeys + 1}, wantErr: "is above"},
		{name: "TTL beyond a century", cfg: idempotency.Config{TTL: 200 * 365 * 24 * time.Hour}, wantErr: "TTL 1752000h0m0s is above"},
		{name: "lease beyond a century", cfg: idempotency.Config{Lease: 200 * 365 * 24 * time.Hour}, wantErr: "Lease 1752000h0m0s is above"},
		{name: "lease below a millisecond", cfg: idempotency.Config{Lease: time.Nanosecond}, wantErr: "Lease 1ns is below 1ms"},
		{name: "negative deferral", cfg: idempotency.Config{InFlightDeferral: -time.Second}, wantErr: "InFlightDeferral -1s is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			_, newErr := idempotency.New(tt.cfg)
			if tt.wantErr == "" {
				require.NoError(t, err)
				require.NoError(t, newErr)
				return
			}
			require.ErrorIs(t, err, idempotency.ErrInvalidConfig)
			assert.ErrorContains(t, err, tt.wantErr)
			assert.ErrorIs(t, newErr, idempotency.ErrInvalidConfig)
		})
	}
}
