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
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/stretchr/testify/require"
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
		res.Out, res.Err = step(msg)
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

// Original returns what a step leaves of the original message's metadata before: the same
// headers, plus the in-memory mark a message given back by decision gets (headers.GivenBack,
// which tells the subscriber to return it with basic.nack) when marked is true.
func Original(before message.Metadata, marked bool) message.Metadata {
	if !marked {
		return before
	}
	out := make(message.Metadata, len(before)+1)
	for k, v := range before {
		out[k] = v
	}
	out[headers.GivenBack] = "1"
	return out
}
