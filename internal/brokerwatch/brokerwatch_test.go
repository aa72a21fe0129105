package brokerwatch_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/brokerwatch"
	"github.com/sluice-go/sluice/router"
)

// The embedded broker's depths are its queue lengths, and it has no connection to lose.
func TestEmbedded(t *testing.T) {
	ctx := context.Background()
	b := router.Embedded(slog.New(slog.DiscardHandler))
	t.Cleanup(func() { _ = b.Close() })
	require.NoError(t, b.DeclareQueue(ctx, "q"))
	for range 3 {
		require.NoError(t, b.Publisher().Publish("q", message.NewMessage("", []byte("x"))))
	}

	src := brokerwatch.DepthSource(b)
	require.NotNil(t, src)
	d, err := src.QueueDepth(ctx, "q")
	require.NoError(t, err)
	assert.EqualValues(t, 3, d.Ready)
	assert.Nil(t, brokerwatch.ConnectionState(b))
}
