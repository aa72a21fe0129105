package router

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/sluice-go/sluice/telemetry"
)

// ErrBatchResults is the (retryable) failure of every message of a batch whose handler
// returned a number of results other than the number of messages: no message can be
// told apart from another, so none is acked.
var ErrBatchResults = errors.New("router: batch handler returned a wrong number of results")

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
type BatchResult struct {
	Err error
	Out []*message.Message
}

// BatchOutputHandlerFunc is a BatchHandlerFunc whose messages produce outputs; it returns
// one BatchResult per message, in the order of msgs.
type BatchOutputHandlerFunc func(ctx context.Context, msgs []*message.Message) []BatchResult

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
	b := &batcher{h: h, cfg: bc, queue: queue, name: name, tel: s.cfg.Telemetry}
	all := append([]HandlerOption{WithConcurrency(bc.size), batchHandler}, opts...)
	return s.add(name, queue, outputTopic, b.handle, all)
}

// batcher collects the messages that reach the innermost step into batches.
type batcher struct {
	h           BatchOutputHandlerFunc
	cfg         batchConfig
	queue, name string
	tel         *telemetry.Instrumentation

	mu      sync.Mutex
	pending []batchItem
	timer   *time.Timer
	gen     uint64 // counts batches taken, so a late timer does not take the next one
}

type batchItem struct {
	msg  *message.Message
	done chan BatchResult
}

// handle is the innermost handler of each message: it joins the pending batch, runs the
// batch when it is full (the timer runs it otherwise) and returns the message's result.
func (b *batcher) handle(msg *message.Message) ([]*message.Message, error) {
	it := batchItem{msg: msg, done: make(chan BatchResult, 1)}
	b.mu.Lock()
	b.pending = append(b.pending, it)
	var full []batchItem
	switch {
	case len(b.pending) >= b.cfg.size:
		full = b.take()
	case len(b.pending) == 1:
		gen := b.gen
		b.timer = time.AfterFunc(b.cfg.wait, func() { b.flush(gen) })
	}
	b.mu.Unlock()
	if full != nil {
		b.run(full)
	}
	r := <-it.done
	return r.Out, r.Err
}

// take returns the pending batch and starts the next; b.mu is held.
func (b *batcher) take() []batchItem {
	items := b.pending
	b.pending = nil
	b.gen++
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	return items
}

// flush runs batch gen if it is still pending once its wait is over.
func (b *batcher) flush(gen uint64) {
	b.mu.Lock()
	if b.gen != gen || len(b.pending) == 0 {
		b.mu.Unlock()
		return
	}
	items := b.take()
	b.mu.Unlock()
	b.run(items)
}

// run calls the handler with items and gives each its result.
func (b *batcher) run(items []batchItem) {
	msgs := make([]*message.Message, len(items))
	for i, it := range items {
		msgs[i] = it.msg
	}
	ctx := msgs[0].Context()
	end := func(error) {}
	if b.tel != nil {
		ctx, end = b.tel.StartBatch(ctx, b.queue, b.name, msgs)
	}
	res, err := b.call(ctx, msgs)
	if err != nil && len(msgs) > 1 {
		// Which message panicked is unknown: each one alone finds out.
		res = make([]BatchResult, len(msgs))
		for i := range msgs {
			one, perr := b.call(ctx, msgs[i:i+1])
			if perr != nil {
				one = []BatchResult{{Err: perr}}
			}
			res[i] = one[0]
		}
	} else if err != nil {
		res = []BatchResult{{Err: err}}
	}
	end(err)
	for i, it := range items {
		it.done <- res[i]
	}
}

// call calls the handler once, turning a panic into a RecoveredPanicError (as the
// single-message recoverer does) and a wrong number of results into ErrBatchResults for
// each message.
func (b *batcher) call(ctx context.Context, msgs []*message.Message) (res []BatchResult, err error) {
	defer func() {
		if r := recover(); r != nil {
			res, err = nil, fmt.Errorf("batch handler %q on %d message(s): %w", b.name, len(msgs), middleware.RecoveredPanicError{V: r, Stacktrace: string(debug.Stack())})
		}
	}()
	res = b.h(ctx, msgs)
	if len(res) != len(msgs) {
		bad := fmt.Errorf("%w: handler %q returned %d for %d message(s)", ErrBatchResults, b.name, len(res), len(msgs))
		res = make([]BatchResult, len(msgs))
		for i := range res {
			res[i].Err = bad
		}
	}
	return res, nil
}
