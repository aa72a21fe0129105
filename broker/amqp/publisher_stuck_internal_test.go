package amqp

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// A channel that takes publishes and never confirms them (seen with RabbitMQ 3.10 in the
// partition scenario, on a channel opened while its node was dropping the quorum queue's
// old leader) must not hold every later publish: once a publish's deadline passes on an
// unblocked connection, the publisher forgets the channel and the next publish is confirmed
// on a fresh one.
func TestPublishDeadlineOnUnblockedConnectionReplacesTheChannel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := New(ctx, Config{URLs: []string{testenv.AMQPURL(t)}})
	require.NoError(t, err)
	defer func() { assert.NoError(t, b.Close()) }()
	queue := testenv.Name("test.stuckconfirm")
	testenv.NewRabbit(t).DeleteQueues(queue, topology.DLQ(queue))
	require.NoError(t, b.DeclareQueue(ctx, queue))
	p := b.Publisher()

	// A real channel in confirm mode whose confirms nobody reads: it takes publishes and
	// confirms none, like the stuck one.
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

	short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelShort()
	err = p.PublishTo(short, "", queue, message.NewMessage("unconfirmed", []byte("x")))
	require.ErrorIs(t, err, context.DeadlineExceeded)

	next, cancelNext := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelNext()
	require.NoError(t, p.PublishTo(next, "", queue, message.NewMessage("after", []byte("x"))),
		"the publish after the deadline is confirmed on a new channel")
	p.mu.Lock()
	assert.NotSame(t, stuck, p.cc, "the stuck channel was replaced")
	p.mu.Unlock()
	select {
	case <-stuck.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the stuck channel was not closed")
	}
}

// A nacked publish also drops the channel (the stuck channel of the partition scenario
// nacked too), and the publisher goes on with a new one.
func TestNackReplacesTheChannel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := New(ctx, Config{URLs: []string{testenv.AMQPURL(t)}})
	require.NoError(t, err)
	defer func() { assert.NoError(t, b.Close()) }()
	// A queue that refuses every message: RabbitMQ nacks the publish.
	full := testenv.Name("test.nackfull")
	r := testenv.NewRabbit(t)
	r.DeleteQueues(full)
	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(full, true, false, false, false, amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"})
	require.NoError(t, err)
	_ = ch.Close()
	p := b.Publisher()

	require.ErrorIs(t, p.PublishTo(ctx, "", full, message.NewMessage("refused", []byte("x"))), ErrNacked)
	p.mu.Lock()
	first := p.cc
	p.mu.Unlock()
	assert.Nil(t, first, "the channel that nacked was forgotten")
	require.ErrorIs(t, p.PublishTo(ctx, "", full, message.NewMessage("refused-again", []byte("x"))), ErrNacked)
}
