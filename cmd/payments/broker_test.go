package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
)

// serve without AMQP_URL refuses to start (it used to consume from the embedded broker,
// nothing ever arriving, and look healthy); the demo still runs on the embedded broker.
func TestConnectBroker_EmbeddedOnlyWhenAsked(t *testing.T) {
	t.Setenv("AMQP_URL", "")
	cfg, err := loadConfig()
	require.NoError(t, err)

	b, err := connectBroker(context.Background(), cfg, newLogger(0))
	require.NoError(t, err, "the demo's default")
	assert.Equal(t, "memory", b.Name())
	require.NoError(t, b.Close())

	cfg.embeddedFallback = false
	_, err = connectBroker(context.Background(), cfg, newLogger(0))
	require.ErrorIs(t, err, amqp.ErrNoURL)
	assert.ErrorContains(t, err, "set AMQP_URL")

	assert.Equal(t, 1, run([]string{"serve"}), "payments serve exits with an error")
}
