package amqp_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
)

var silentLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// Connect does not fall back to the embedded broker: a deployment without a URL must fail
// to start. ConnectOrEmbedded asks for the fallback. Neither reads AMQP_URL: the program
// passes it.
func TestConnect_RequiresAURL(t *testing.T) {
	t.Setenv("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/") // ignored: the library reads no environment
	_, err := amqp.Connect(context.Background(), "", silentLogger)
	require.ErrorIs(t, err, amqp.ErrNoURL)
	assert.ErrorContains(t, err, "no broker URL")

	b, err := amqp.ConnectOrEmbedded(context.Background(), " , ", silentLogger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	assert.Equal(t, "memory", b.Name())
}
