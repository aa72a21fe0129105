package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadConfigProducer(t *testing.T) {
	for _, tc := range []struct {
		name                              string
		outboxDir, secondary, amqpURL, np string
		wantErr                           string
	}{
		{name: "neither"},
		{name: "outbox on the embedded broker", outboxDir: "/tmp/x"},
		{name: "outbox and a second cluster", outboxDir: "/tmp/x", secondary: "amqp://b/", amqpURL: "amqp://a/"},
		{name: "second cluster without a first", secondary: "amqp://b/", wantErr: "AMQP_SECONDARY_URL needs AMQP_URL"},
		{name: "outbox with partitions", outboxDir: "/tmp/x", np: "4", wantErr: "unset PAYMENTS_PARTITIONS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PAYMENTS_OUTBOX_DIR", tc.outboxDir)
			t.Setenv("AMQP_SECONDARY_URL", tc.secondary)
			t.Setenv("AMQP_URL", tc.amqpURL)
			t.Setenv("PAYMENTS_PARTITIONS", tc.np)
			cfg, err := loadConfig()
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.outboxDir, cfg.outboxDir)
			assert.Equal(t, tc.secondary, cfg.secondaryURL)
		})
	}
}
