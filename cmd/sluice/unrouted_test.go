package main

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

func TestUnroutedCommands(t *testing.T) {
	r := testenv.NewRabbit(t)
	testenv.LockUnrouted(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{r.URL}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	exchange, queue := testenv.Name("test.cli.unrouted"), testenv.Name("test.cli.unrouted.sub")
	r.DeleteQueues(queue, topology.DLQ(queue))
	t.Cleanup(func() {
		if ch, err := r.Conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(exchange, false, false)
			_ = ch.Close()
		}
	})
	require.NoError(t, b.DeclareExchange(ctx, exchange, broker.Topic, false))
	require.NoError(t, b.PublishToExchange(ctx, exchange, "order.created", message.NewMessage("cli-1", []byte(`{"n":1}`))))

	cases := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  []string
	}{
		{name: "list", args: []string{"list", "--exchange", exchange}, wantOut: []string{"cli-1", exchange, "order.created", `{"n":1}`}},
		{name: "replay needs a selection", args: []string{"replay"}, wantCode: exitUsage},
		{name: "dry run", args: []string{"replay", "--exchange", exchange, "--dry-run"}, wantOut: []string{"would replay cli-1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runIn(r.URL, append([]string{"dlq", "unrouted"}, tc.args...)...)
			require.Equal(t, tc.wantCode, code, "stderr: %s", errOut)
			for _, w := range tc.wantOut {
				assert.Contains(t, out, w)
			}
		})
	}
	require.NoError(t, b.DeclareSubscription(ctx, queue, []broker.Binding{{Exchange: exchange, Keys: []string{"order.*"}}}, false))
	code, out, errOut := runIn(r.URL, "dlq", "unrouted", "replay", "--exchange", exchange)
	require.Equal(t, exitOK, code, "stderr: %s", errOut)
	assert.Contains(t, out, "replayed cli-1 to exchange "+exchange)
	require.Eventually(t, func() bool { return r.Count(queue) == 1 }, 10*time.Second, 20*time.Millisecond)
	_, out, _ = runIn(r.URL, "dlq", "unrouted", "list", "--exchange", exchange)
	assert.Contains(t, out, "no selected events")
}
