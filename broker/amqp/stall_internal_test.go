package amqp

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// syncBuffer is a log sink safe for the broker's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// installStuckChannel makes p publish on a real channel in confirm mode whose confirms
// nobody reads: it takes publishes and confirms none, as a RabbitMQ 4.x node on the
// minority side of a partition does. The channel fails what it holds when it closes.
func installStuckChannel(t *testing.T, ctx context.Context, p *Publisher) {
	t.Helper()
	ch, err := p.conn.channel(ctx)
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	stuck := &confirmChannel{ch: ch, pending: map[uint64]*inflight{}, done: make(chan struct{})}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		defer close(stuck.done)
		<-closed
		stuck.failAll(errChannelLost)
	}()
	p.mu.Lock()
	p.cc = stuck
	p.mu.Unlock()
}

// A publishing connection whose node stops confirming is closed once
// ConfirmStallTimeout passes, and the publisher reconnects through the next URL and
// publishes again what was unconfirmed; on a node that confirms, or nacks now and then
// between confirms, it stays.
func TestConfirmStallMovesThePublisherToTheNextNode(t *testing.T) {
	const bound = time.Second
	url := testenv.AMQPURL(t)
	r := testenv.NewRabbit(t)
	tests := []struct {
		name string
		// queue declares the queue the case publishes to.
		queue func(t *testing.T, name string)
		// run publishes as the case needs and returns the last publish's error.
		run           func(t *testing.T, ctx context.Context, p *Publisher, queue string) error
		wantReconnect bool
		wantErr       error
	}{
		{
			name:  "a confirm that never comes",
			queue: declareClassic(r, nil),
			run: func(t *testing.T, ctx context.Context, p *Publisher, queue string) error {
				installStuckChannel(t, ctx, p)
				// Its deadline is far beyond the bound: the publish is confirmed on the next
				// connection, not failed at its deadline.
				pubCtx, cancel := context.WithTimeout(ctx, 20*bound)
				defer cancel()
				return p.PublishTo(pubCtx, "", queue, message.NewMessage("unconfirmed-at-first", []byte("x")))
			},
			wantReconnect: true,
		},
		{
			name:  "nacks and nothing else",
			queue: declareClassic(r, amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"}),
			run: func(t *testing.T, ctx context.Context, p *Publisher, queue string) error {
				var err error
				for i := 0; p.conn.reconnects.Load() == 0 && ctx.Err() == nil; i++ {
					err = p.PublishTo(ctx, "", queue, message.NewMessage(fmt.Sprintf("refused-%d", i), []byte("x")))
				}
				return err
			},
			wantReconnect: true,
			wantErr:       ErrNacked,
		},
		{
			name:  "confirms for three bounds",
			queue: declareClassic(r, nil),
			run: func(t *testing.T, ctx context.Context, p *Publisher, queue string) error {
				end := time.Now().Add(3 * bound)
				for i := 0; time.Now().Before(end); i++ {
					if err := p.PublishTo(ctx, "", queue, message.NewMessage(fmt.Sprintf("ok-%d", i), []byte("x"))); err != nil {
						return err
					}
				}
				return nil
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			queue := testenv.Name("test.stall")
			r.DeleteQueues(queue, topology.DLQ(queue))
			t.Cleanup(func() { r.DeleteQueues(queue, topology.DLQ(queue)) })
			tt.queue(t, queue)
			var logs syncBuffer
			// Two URLs of the one node: "the next URL" is the only other there is here.
			b, err := New(ctx, Config{URLs: []string{url, url}, ConfirmStallTimeout: bound,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			require.NoError(t, err)
			defer func() { assert.NoError(t, b.Close()) }()
			p := b.Publisher()

			err = tt.run(t, ctx, p, queue)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
			} else {
				require.NoError(t, err, "the publish is confirmed")
			}
			if !tt.wantReconnect {
				assert.Zero(t, p.conn.reconnects.Load(), "reconnects of a publisher whose node confirms; log:\n%s", logs.String())
				assert.NotContains(t, logs.String(), "stopped confirming")
				return
			}
			require.Eventually(t, func() bool { return p.conn.reconnects.Load() > 0 }, 30*time.Second, 10*time.Millisecond,
				"the publisher reconnects; log:\n%s", logs.String())
			assert.Contains(t, logs.String(), "RabbitMQ node stopped confirming publishes; reconnecting through the next URL")
			// The new connection confirms.
			require.NoError(t, p.PublishTo(ctx, "", topology.DLQ(queue), message.NewMessage("after", []byte("x"))),
				"a publish on the new connection is confirmed")
		})
	}
}

// declareClassic returns a queue declaration with args, for a table case.
func declareClassic(r *testenv.Rabbit, args amqp.Table) func(t *testing.T, name string) {
	return func(t *testing.T, name string) {
		t.Helper()
		ch, err := r.Conn.Channel()
		require.NoError(t, err)
		defer func() { _ = ch.Close() }()
		for _, q := range []string{name, topology.DLQ(name)} {
			a := args
			if q != name {
				a = nil // a queue that takes messages, for the check after the reconnect
			}
			_, err = ch.QueueDeclare(q, true, false, false, false, a)
			require.NoError(t, err, "declare queue %s", q)
		}
	}
}

// ConfirmStallTimeout's zero value is the default, a negative one is kept (the watch is
// off), and a positive one under the minimum is refused.
func TestConfirmStallTimeoutConfig(t *testing.T) {
	tests := []struct {
		name    string
		value   time.Duration
		want    time.Duration
		wantErr string
	}{
		{name: "zero is the default", value: 0, want: defaultConfirmStallTimeout},
		{name: "negative turns it off", value: -1, want: -1},
		{name: "the minimum", value: minConfirmStallTimeout, want: minConfirmStallTimeout},
		{name: "under the minimum", value: 500 * time.Millisecond, wantErr: "amqp: ConfirmStallTimeout 500ms is below the minimum 1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{URLs: []string{"amqp://guest:guest@127.0.0.1:5672/"}, ConfirmStallTimeout: tt.value}
			err := cfg.setDefaults()
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, cfg.ConfirmStallTimeout)
		})
	}
}
