package amqp

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/pausegate"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// TestConsumeArgs checks what a subscriber asks of the shared node of the tests' version
// for its consumer: x-consumer-timeout, the settle bound rounded up to a whole second, on
// RabbitMQ 4.x when the bound exceeds the node's consumer timeout; nothing otherwise, with
// a warning once per queue on 3.x saying what the operator sets.
func TestConsumeArgs(t *testing.T) {
	is4 := testenv.Is43()
	tests := []struct {
		name     string
		within   time.Duration
		node     time.Duration // Config.ConsumerTimeout, before setDefaults
		limit    int           // a pause gate's limit (a breaker's half-open probes); 0 none
		refused  bool          // the queue refused the argument before
		wantMS   int64         // on 4.x; 0: no argument
		wantWarn bool          // on 3.x
	}{
		{name: "no bound declared", within: 0, node: 3 * time.Second},
		{name: "bound below RabbitMQ's default 30 min", within: 75 * time.Second},
		{name: "bound equal to the node's", within: 3 * time.Second, node: 3 * time.Second},
		{name: "bound above the node's", within: 75 * time.Second, node: 3 * time.Second, wantMS: 75000, wantWarn: true},
		{name: "rounded up to a whole second", within: 75*time.Second + time.Millisecond, node: 3 * time.Second, wantMS: 76000, wantWarn: true},
		{name: "above the 30 min default", within: 31 * time.Minute, wantMS: 31 * 60000, wantWarn: true},
		{name: "the node enforces none", within: 75 * time.Second, node: -1},
		{name: "the queue refused it before (a classic queue)", within: 75 * time.Second, node: 3 * time.Second, refused: true},
		{name: "a limit holding three turns of the one slot", within: 75 * time.Second, node: 3 * time.Second, limit: 3, wantMS: 225000, wantWarn: true},
	}
	connCfg := Config{URLs: []string{testenv.AMQPURL(t)}, Logger: slog.New(slog.DiscardHandler)}
	require.NoError(t, connCfg.setDefaults())
	conn, err := dialConnection(context.Background(), connCfg, "test consume args")
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.close() })
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs strings.Builder
			cfg := Config{URLs: []string{"amqp://127.0.0.1/"}, ConsumerTimeout: tc.node, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
			require.NoError(t, cfg.setDefaults())
			s := newSubscriber(conn, cfg, broker.SubscribeOptions{Concurrency: 1, SettleWithin: tc.within})
			if tc.refused {
				s.timeouts.refused.Store("q", struct{}{})
			}
			opts := optsFor(s.opts, pausegate.State{Limit: tc.limit})
			for range 3 { // as a subscriber consuming again after each loss would
				args := s.consumeArgs("q", opts)
				if is4 && tc.wantMS > 0 {
					assert.Equal(t, amqp.Table{"x-consumer-timeout": tc.wantMS}, args)
				} else {
					assert.Nil(t, args)
				}
			}
			warned := strings.Count(logs.String(), "set consumer_timeout in rabbitmq.conf")
			if !is4 && tc.wantWarn {
				assert.Equal(t, 1, warned, "warned once per queue:\n%s", logs.String())
				assert.Contains(t, logs.String(), fmt.Sprintf("set_consumer_timeout_ms=%d", tc.wantMS))
			} else {
				assert.Zero(t, warned, logs.String())
			}
		})
	}
}

// TestTimeoutRefused: only RabbitMQ's refusal of x-consumer-timeout for a queue's type
// makes the subscriber consume without it, remembered for the queue and logged once.
func TestTimeoutRefused(t *testing.T) {
	refusal := &amqp.Error{Code: amqp.PreconditionFailed, Server: true,
		Reason: "PRECONDITION_FAILED - invalid arg 'x-consumer-timeout' for queue 'q' in vhost '/' of queue type rabbit_classic_queue"}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{name: "the classic queue's refusal", err: refusal, want: true},
		{name: "wrapped", err: fmt.Errorf("consume: %w", refusal), want: true},
		{name: "another precondition", err: &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - exclusive consume unavailable"}},
		{name: "not found", err: &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no queue 'q' in vhost '/'"}},
		{name: "a closed connection", err: amqp.ErrClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs strings.Builder
			s := newSubscriber(nil, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, broker.SubscribeOptions{})
			for range 2 {
				assert.Equal(t, tc.want, s.timeoutRefused("q", tc.err))
			}
			_, remembered := s.timeouts.refused.Load("q")
			assert.Equal(t, tc.want, remembered)
			if tc.want {
				assert.Equal(t, 1, strings.Count(logs.String(), "queue refuses x-consumer-timeout"), logs.String())
			} else {
				assert.Empty(t, logs.String())
			}
		})
	}
}

func TestRoundUpSecond(t *testing.T) {
	tests := []struct{ in, want time.Duration }{
		{in: 75 * time.Second, want: 75 * time.Second},
		{in: 75*time.Second + time.Nanosecond, want: 76 * time.Second},
		{in: 500 * time.Millisecond, want: time.Second},
		{in: time.Duration(1<<63 - 1), want: time.Duration(1<<63 - 1).Truncate(time.Second)},
	}
	for _, tc := range tests {
		t.Run(tc.in.String(), func(t *testing.T) {
			assert.Equal(t, tc.want, roundUpSecond(tc.in))
		})
	}
}
