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
// to start (a program that wants the fallback calls memory.New itself, as the payments demo
// does). It does not read AMQP_URL: the program passes it.
func TestConnect_RequiresAURL(t *testing.T) {
	t.Setenv("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/") // ignored: the library reads no environment
	for _, url := range []string{"", " , "} {
		_, err := amqp.Connect(context.Background(), url, silentLogger)
		require.ErrorIs(t, err, amqp.ErrNoURL, "url %q", url)
		assert.ErrorContains(t, err, "no broker URL", "url %q", url)
	}
}
