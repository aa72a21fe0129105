package router

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/router/internal/batch"
)

// ErrBatchResults is the (retryable) failure of every message of a batch whose handler
// returned a number of results other than the number of messages: no message can be
// told apart from another, so none is acked.
var ErrBatchResults = batch.ErrResults

// BatchHandlerFunc handles a batch of messages at once (one bulk database write) and
// returns one error per message, in the order of msgs: nil for a success, else any error
// of sluice's failure vocabulary (a plain error is retried; sluice.Permanent,
// sluice.Discard, sluice.RetryAfter and sluice.Defer mean what they mean for a single
// message). A nil slice means every message succeeded. ctx is the batch's: it carries
// the batch span and ends when the first message of the batch reaches its handler
// deadline or the stack shuts down.
type BatchHandlerFunc func(ctx context.Context, msgs []*message.Message) []error

// BatchResult is the outcome of one message of a batch with outputs: Err as for
// BatchHandlerFunc, Out the messages it produces, published (confirmed) before that
// message is acked.
type BatchResult = batch.Result

// BatchOutputHandlerFunc is a BatchHandlerFunc whose messages produce outputs; it returns
// one BatchResult per message, in the order of msgs.
type BatchOutputHandlerFunc = batch.HandlerFunc

// batchConfig is WithBatch's; the zero value means no batching.
type batchConfig struct {
	size int
	wait time.Duration
}

// defaultBatchWait is the wait of WithBatch(size, 0).
const defaultBatchWait = 100 * time.Millisecond

// WithBatch sets how HandleBatch and HandleBatchWithOutput collect a batch: the handler
// is called with size messages, or with those that arrived within wait of the first one
// when fewer come (zero means 100ms). Without it a batch is 1 message.
//
// A batch is made of the messages the handler works on at once, so the handler's
// concurrency (WithConcurrency) defaults to size and should not be set lower; a higher
// value lets the next batch fill while one is handled. Handle and HandleWithOutput refuse
// it with ErrInvalidOption.
func WithBatch(size int, wait time.Duration) HandlerOption {
	return func(c *handlerConfig) { c.batch = batchConfig{size: size, wait: wait} }
}

// batchHandler marks the registration as HandleBatch's, for which WithBatch is valid.
func batchHandler(c *handlerConfig) { c.batched = true }

// HandleBatch registers h to consume queue in batches (WithBatch). Every message goes
// through the stack's steps on its own, exactly as with Handle — tracing (one consumer
// span per message, each linked from the batch span), poison, retry with its own retry
// count, idempotency (a duplicate is acked without joining a batch), Config.Middleware,
// breaker and deadline — and, inside them all, waits for its batch: the handler is
// called once per batch, and each message's result is that message's outcome.
//
// When the handler panics, nothing tells which message made it, so the batch's
// messages are handed to it again one at a time: the one that panics fails alone (a
// retryable failure carrying the panic, as for Handle), the others get their own
// results.
func (s *Stack) HandleBatch(name, queue string, h BatchHandlerFunc, opts ...HandlerOption) error {
	return s.HandleBatchWithOutput(name, queue, "", func(ctx context.Context, msgs []*message.Message) []BatchResult {
		errs := h(ctx, msgs)
		if errs == nil {
			return make([]BatchResult, len(msgs))
		}
		res := make([]BatchResult, len(errs))
		for i, err := range errs {
			res[i].Err = err
		}
		return res
	}, opts...)
}

// HandleBatchWithOutput is HandleBatch for a handler whose messages produce outputs,
// published to the queue outputTopic, confirmed, before the message that produced them is
// acked.
func (s *Stack) HandleBatchWithOutput(name, queue, outputTopic string, h BatchOutputHandlerFunc, opts ...HandlerOption) error {
	var hc handlerConfig
	for _, o := range opts {
		o(&hc)
	}
	bc := hc.batch
	if bc.size == 0 {
		bc.size = 1
	}
	if bc.size < 0 || bc.wait < 0 {
		return fmt.Errorf("%w: handler %q has WithBatch(%d, %s), size must be 1 or more and wait not negative", ErrInvalidOption, name, bc.size, bc.wait)
	}
	if bc.wait == 0 {
		bc.wait = defaultBatchWait
	}
	var tr batch.Tracer
	if s.tel != nil {
		tr = s.tel
	}
	b := batch.New(h, batch.Config{Size: bc.size, Wait: bc.wait}, queue, name, tr)
	all := append([]HandlerOption{WithConcurrency(bc.size), batchHandler}, opts...)
	return s.add(name, queue, outputTopic, b.Handle, all)
}
