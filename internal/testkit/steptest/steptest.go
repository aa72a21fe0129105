// Package steptest runs one sluice step the way the stack does: inside a real Watermill
// router (over gochannel), which puts the queue and handler name in the message context,
// and an Observer that records the outcomes a step reports (package disposition). The step
// packages' unit tests share it.
package steptest

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
)

// Message is the message sent through the step and where it comes from.
type Message struct {
	Queue, Handler string
	Payload        []byte
	Metadata       message.Metadata
}

// Result is what one message did through the step.
type Result struct {
	// Msg is the message the step received; Before is its metadata before the step ran.
	Msg    *message.Message
	Before message.Metadata
	Out    []*message.Message
	Err    error
	// Settlement is how a sluice subscriber would settle the message if nacked: what the
	// step said on the message's broker.Delivery, which Run gives it as a sluice subscriber
	// does (broker.SettleReject when it said nothing).
	Settlement broker.Settlement
}

// Observer records the outcomes a step reports (disposition.Observer).
type Observer struct{ Log[disposition.Outcome] }

// Observe records o.
func (o *Observer) Observe(_ context.Context, out disposition.Outcome) { o.Add(out) }

// Report is the part of an outcome the step tests compare.
type Report struct {
	Outcome disposition.Kind
	Delay   time.Duration
	Attempt int
	Err     error
}

// Last returns the last outcome other than an Ack (the default of an attempt that nothing
// went wrong with), and whether there is one.
func (o *Observer) Last() (Report, bool) {
	all := o.All()
	for i := len(all) - 1; i >= 0; i-- {
		if d := all[i].Disposition; d.Kind != disposition.Ack {
			return Report{Outcome: d.Kind, Delay: d.Delay, Attempt: all[i].Attempt, Err: d.Reason}, true
		}
	}
	return Report{}, false
}

// Run sends in through mw around h and returns what happened. The step's error is the
// result, not a reason to redeliver: the router acks the message either way.
func Run(t testing.TB, mw message.HandlerMiddleware, h message.HandlerFunc, in Message) Result {
	t.Helper()
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	require.NoError(t, err)

	results := make(chan Result, 1)
	step := mw(h)
	router.AddConsumerHandler(in.Handler, in.Queue, pubSub, func(msg *message.Message) error {
		res := Result{Msg: msg, Before: msg.CopyWithContext().Metadata}
		ctx, delivery := broker.WithDelivery(msg.Context())
		msg.SetContext(ctx)
		res.Out, res.Err = step(msg)
		res.Settlement = delivery.Settlement()
		results <- res
		return nil
	})
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.Background()) }()
	defer func() {
		require.NoError(t, router.Close())
		require.NoError(t, <-runErr)
		require.NoError(t, pubSub.Close())
	}()
	select {
	case <-router.Running():
	case <-time.After(10 * time.Second):
		t.Fatal("router did not start")
	}

	msg := message.NewMessage(watermill.NewUUID(), in.Payload)
	for k, v := range in.Metadata {
		msg.Metadata.Set(k, v)
	}
	require.NoError(t, pubSub.Publish(in.Queue, msg))
	select {
	case res := <-results:
		return res
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was not called")
		return Result{}
	}
}
