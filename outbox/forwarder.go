package outbox

import (
	"context"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/outboxstore"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v4"
)

// forward drains the outbox in order until Close: a batch of the oldest entries is
// published (consecutive entries of one topic together, confirms pipelined), and removed
// once confirmed. A failed batch stays where it is and its oldest entry is tried again
// after a backoff, so nothing behind it overtakes it; batches then grow back.
func (p *Publisher) forward() {
	defer close(p.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.closing:
			cancel()
		case <-ctx.Done():
		}
	}()

	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 50 * time.Millisecond
	bo.MaxInterval = p.cfg.RetryMaxInterval
	bo.MaxElapsedTime = 0
	// After a failure only the oldest entry is tried until it is confirmed, then the batch
	// doubles with each success: a broker that is connected but blocked or slow keeps what
	// it was sent and confirms it later, so a whole batch sent again on every retry would
	// come out that many times.
	size := p.cfg.ForwardBatch
	for {
		entries, err := p.store.Peek(size)
		if err == nil && len(entries) == 0 {
			select {
			case <-p.kick:
				continue
			case <-p.closing:
				return
			}
		}
		if err == nil {
			err = p.forwardEntries(ctx, entries)
		}
		if err == nil {
			size = min(2*size, p.cfg.ForwardBatch)
			bo.Reset()
			continue
		}
		size = 1
		if ctx.Err() != nil {
			return
		}
		wait := bo.NextBackOff()
		p.cfg.Logger.Debug("outbox: forwarding failed; trying again", "error", err, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-p.closing:
			t.Stop()
			return
		}
	}
}

// forwardEntries publishes entries in order, one run of a topic at a time, and removes
// each run once confirmed.
func (p *Publisher) forwardEntries(ctx context.Context, entries []outboxstore.Entry) error {
	for len(entries) > 0 {
		n := 1
		for n < len(entries) && entries[n].Topic == entries[0].Topic {
			n++
		}
		run := entries[:n]
		entries = entries[n:]
		err := p.publishRun(ctx, run)
		if err != nil && p.cfg.Permanent(err) {
			// One of the run cannot be published: find it, one at a time, so that the
			// ones before it go out and it alone is set aside.
			return p.forwardOneByOne(ctx, run)
		}
		if err != nil {
			p.unconfirmed.Add(uint64(len(run)))
			return err
		}
		if err := p.removed(run, ""); err != nil {
			return err
		}
	}
	return nil
}

func (p *Publisher) forwardOneByOne(ctx context.Context, run []outboxstore.Entry) error {
	for i := range run {
		err := p.publishRun(ctx, run[i:i+1])
		reason := ""
		if err != nil {
			if !p.cfg.Permanent(err) {
				p.unconfirmed.Add(1)
				return err
			}
			reason = err.Error()
			p.cfg.Logger.Error("outbox: message rejected by the broker; set aside", "uuid", run[i].UUID, "topic", run[i].Topic, "error", err)
		}
		if err := p.removed(run[i:i+1], reason); err != nil {
			return err
		}
	}
	return nil
}

func (p *Publisher) publishRun(ctx context.Context, run []outboxstore.Entry) error {
	msgs := make([]*message.Message, len(run))
	for i, e := range run {
		msgs[i] = e.Message()
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ForwardTimeout)
	defer cancel()
	return sluice.PublishContext(ctx, p.pub, run[0].Topic, msgs...)
}

// removed takes confirmed entries (reason empty) or rejected ones out of the outbox.
func (p *Publisher) removed(run []outboxstore.Entry, reason string) error {
	seqs := make([]uint64, len(run))
	for i, e := range run {
		seqs[i] = e.Seq
	}
	if reason == "" {
		if err := p.store.Remove(seqs...); err != nil {
			return err
		}
		p.forwarded.Add(uint64(len(run)))
	} else {
		if err := p.store.Reject(reason, seqs...); err != nil {
			return err
		}
		p.rejected.Add(uint64(len(run)))
	}
	p.mu.Lock()
	p.queued -= len(run)
	drained := p.queued == 0
	p.mu.Unlock()
	if drained {
		p.cfg.Logger.Info("outbox: drained; publishing directly again", "dir", p.cfg.Dir)
	}
	return nil
}
