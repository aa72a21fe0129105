// Package batch collects the messages that reach a batch handler's innermost step into
// batches, calls the handler once per batch and gives each message its own result
// (router.HandleBatch). Every message has passed the stack's steps on its own before it
// waits here.
package batch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/internal/attempt"
	"github.com/sluice-go/sluice/internal/panics"
)

// ErrResults is the (retryable) failure of every message of a batch whose handler
// returned a number of results other than the number of messages: no message can be
// told apart from another, so none is acked.
var ErrResults = errors.New("router: batch handler returned a wrong number of results")

// Result is the outcome of one message of a batch: Err as for a single message's handler,
// Out the messages it produces, published (confirmed) before that message is acked.
type Result struct {
	Err error
	Out []*message.Message
}

// HandlerFunc handles a batch and returns one Result per message, in the order of msgs.
type HandlerFunc func(ctx context.Context, msgs []*message.Message) []Result

// Config says how a batch is collected. Size must be 1 or more and Wait positive (the
// router fills the defaults).
type Config struct {
	// Size is the most messages of one batch.
	Size int
	// Wait is how long a batch waits for more messages after its first.
	Wait time.Duration
}

// Tracer starts the span of one batch (telemetry.Instrumentation.StartBatch); end ends it.
type Tracer interface {
	StartBatch(ctx context.Context, queue, handler string, msgs []*message.Message) (context.Context, func(err error))
}

// Batcher collects one handler's messages into batches.
type Batcher struct {
	h           HandlerFunc
	cfg         Config
	queue, name string
	tr          Tracer // nil: no batch span

	mu      sync.Mutex
	pending []item
	timer   *time.Timer
	gen     uint64 // counts batches taken, so a late timer does not take the next one
}

// New returns the batcher of handler name consuming queue; a nil tr records no span.
func New(h HandlerFunc, cfg Config, queue, name string, tr Tracer) *Batcher {
	return &Batcher{h: h, cfg: cfg, queue: queue, name: name, tr: tr}
}

type item struct {
	msg  *message.Message
	done chan Result
}

// Handle is the innermost handler of each message: it joins the pending batch, runs the
// batch when it is full (the timer runs it otherwise) and returns the message's result.
func (b *Batcher) Handle(msg *message.Message) ([]*message.Message, error) {
	it := item{msg: msg, done: make(chan Result, 1)}
	b.mu.Lock()
	b.pending = append(b.pending, it)
	var full []item
	switch {
	case len(b.pending) >= b.cfg.Size:
		full = b.take()
	case len(b.pending) == 1:
		gen := b.gen
		b.timer = time.AfterFunc(b.cfg.Wait, func() { b.flush(gen) })
	}
	b.mu.Unlock()
	if full != nil {
		b.run(msg.Context(), full)
	}
	r := <-it.done
	return r.Out, r.Err
}

// take returns the pending batch and starts the next; b.mu is held.
func (b *Batcher) take() []item {
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
func (b *Batcher) flush(gen uint64) {
	b.mu.Lock()
	if b.gen != gen || len(b.pending) == 0 {
		b.mu.Unlock()
		return
	}
	items := b.take()
	b.mu.Unlock()
	b.run(nil, items)
}

// run calls the handler with items and gives each its result. self is the context of the
// message whose goroutine runs it, nil on the timer's.
func (b *Batcher) run(self context.Context, items []item) {
	msgs := make([]*message.Message, len(items))
	ctxs := make([]context.Context, len(items))
	for i, it := range items {
		msgs[i] = it.msg
		ctxs[i] = it.msg.Context()
	}
	// An attempt of the batch abandoned at its handler timeout names where the batch is
	// stuck: this goroutine's stack.
	defer attempt.LabelBatch(self, ctxs...)()
	ctx := msgs[0].Context()
	end := func(error) {}
	if b.tr != nil {
		ctx, end = b.tr.StartBatch(ctx, b.queue, b.name, msgs)
	}
	res, err := b.call(ctx, msgs)
	if err != nil && len(msgs) > 1 {
		// Which message panicked is unknown: each one alone finds out.
		res = make([]Result, len(msgs))
		for i := range msgs {
			one, perr := b.call(ctx, msgs[i:i+1])
			if perr != nil {
				one = []Result{{Err: perr}}
			}
			res[i] = one[0]
		}
	} else if err != nil {
		res = []Result{{Err: err}}
	}
	end(err)
	for i, it := range items {
		it.done <- res[i]
	}
}

// call calls the handler once, turning a panic into an error carrying its stack (as the
// single-message recoverer does) and a wrong number of results into ErrResults for each
// message.
func (b *Batcher) call(ctx context.Context, msgs []*message.Message) (res []Result, err error) {
	defer func() {
		if r := recover(); r != nil {
			res, err = nil, fmt.Errorf("batch handler %q on %d message(s): %w", b.name, len(msgs), panics.Of(r))
		}
	}()
	res = b.h(ctx, msgs)
	if len(res) != len(msgs) {
		bad := fmt.Errorf("%w: handler %q returned %d for %d message(s)", ErrResults, b.name, len(res), len(msgs))
		res = make([]Result, len(msgs))
		for i := range res {
			res[i].Err = bad
		}
	}
	return res, nil
}
