// Package steptest runs one sluice step the way the stack does: inside a real Watermill
// router (over gochannel), which puts the queue and handler name in the message context,
// with a report.Reporter in the context as the telemetry step puts it. The step packages'
// unit tests share it.
package steptest

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/sluice-go/sluice/internal/report"
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
	// Report is what the step reported for the attempt, if Reported.
	Report   report.Report
	Reported bool
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
		ctx, rep := report.NewContext(msg.Context())
		msg.SetContext(ctx)
		res := Result{Msg: msg, Before: msg.CopyWithContext().Metadata}
		res.Out, res.Err = step(msg)
		res.Report, res.Reported = rep.Get()
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
