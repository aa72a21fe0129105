package amqp

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// defaultConfirmStallTimeout is Config.ConfirmStallTimeout's zero value: below the default
// PublishTimeout, so a publish without a deadline of its own is moved to another node
// before it fails, and well above any confirm a healthy node takes.
const defaultConfirmStallTimeout = 20 * time.Second

// minConfirmStallTimeout is the shortest Config.ConfirmStallTimeout accepted: shorter, a
// busy but healthy node would be left for nothing.
const minConfirmStallTimeout = time.Second

// stallChecks is how many times per Config.ConfirmStallTimeout the watch looks: a stall
// is acted on between one and 1+1/stallChecks periods after it began.
const stallChecks = 4

// stallWatch detects a publishing connection whose node stopped confirming. A RabbitMQ 4.x
// node on the minority side of a partition keeps its clients' connections and channels
// but nacks publishes to quorum queues or never confirms them; a new channel there fares
// no better (forgetChannel), only another node does. The hot path pays one atomic add per
// confirm: the watch samples counters and the oldest unconfirmed publish from a goroutine
// of its own, with no round trip to RabbitMQ.
type stallWatch struct {
	bound time.Duration
	// acks counts positive confirms on the publisher's channels; failures counts nacks and
	// publishes whose deadline passed before their confirm (forgetChannel).
	acks, failures atomic.Uint64

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// startStallWatch starts watching p's connection, unless Config.ConfirmStallTimeout turned
// the check off (nil then).
func startStallWatch(p *Publisher, bound time.Duration) *stallWatch {
	if bound <= 0 {
		return nil
	}
	w := &stallWatch{bound: bound, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run(p)
	return w
}

// acked counts a positive confirm. Nil-safe: a channel built without a watch counts nothing.
func (w *stallWatch) acked() {
	if w != nil {
		w.acks.Add(1)
	}
}

// failed counts a nack or a publish that missed its deadline waiting for a confirm.
func (w *stallWatch) failed() {
	if w != nil {
		w.failures.Add(1)
	}
}

// close stops the watch and waits for it.
func (w *stallWatch) close() {
	if w == nil {
		return
	}
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
}

// stallState is what the watch remembers between two looks at one connection.
type stallState struct {
	conn           *amqp.Connection
	acks, failures uint64
	// troubledSince is when the connection last had something to confirm with every look
	// since finding it so, and no confirm came: zero while it has nothing to confirm.
	troubledSince time.Time
	// oldestCC, oldestSeq and oldestSince are the oldest unconfirmed publish seen and when
	// it was first seen oldest.
	oldestCC    *confirmChannel
	oldestSeq   uint64
	oldestSince time.Time
}

// run looks at the connection stallChecks times per bound until the publisher or its
// connection closes.
func (w *stallWatch) run(p *Publisher) {
	defer close(w.done)
	t := time.NewTicker(w.bound / stallChecks)
	defer t.Stop()
	var st stallState
	for {
		select {
		case <-w.stop:
			return
		case <-p.conn.closing:
			return
		case now := <-t.C:
			if reason := w.look(p, &st, now); reason != "" {
				p.conn.abandon(st.conn, reason)
				st = stallState{}
			}
		}
	}
}

// look updates st with the connection's state at now and says why the connection stalled,
// or returns "" while it did not.
func (w *stallWatch) look(p *Publisher, st *stallState, now time.Time) string {
	acks, failures := w.acks.Load(), w.failures.Load()
	progress, failed := acks != st.acks, failures != st.failures
	st.acks, st.failures = acks, failures
	conn := p.conn.current()
	if conn == nil || conn != st.conn || p.conn.blockedErr() != nil {
		// A new connection starts afresh; one RabbitMQ blocked is waiting for an alarm to
		// clear, on every node alike, and is left to PublishTimeout.
		*st = stallState{conn: conn, acks: acks, failures: failures}
		return ""
	}
	p.mu.Lock()
	cc := p.cc
	p.mu.Unlock()
	var seq uint64
	pending := false
	if cc != nil {
		seq, pending = cc.oldest()
	}
	// One publish unconfirmed for the whole bound, whatever else was confirmed meanwhile.
	switch {
	case !pending:
		st.oldestCC = nil
	case cc != st.oldestCC || seq != st.oldestSeq:
		st.oldestCC, st.oldestSeq, st.oldestSince = cc, seq, now
	case now.Sub(st.oldestSince) >= w.bound:
		return fmt.Sprintf("publish %d on this channel unconfirmed for %s", seq, now.Sub(st.oldestSince).Round(time.Millisecond))
	}
	// Or nothing confirmed for the whole bound while something always waited: publishes
	// unconfirmed, nacked, or given up at their deadline (their channel replaced).
	switch {
	case !pending && !failed:
		st.troubledSince = time.Time{}
	case progress || st.troubledSince.IsZero():
		st.troubledSince = now
	case now.Sub(st.troubledSince) >= w.bound:
		return fmt.Sprintf("no publish confirmed for %s while publishes waited, were nacked or missed their deadline", now.Sub(st.troubledSince).Round(time.Millisecond))
	}
	return ""
}

// oldest returns the sequence number of cc's oldest unconfirmed publish, and whether there
// is one.
func (cc *confirmChannel) oldest() (uint64, bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	var seq uint64
	for tag := range cc.pending {
		if seq == 0 || tag < seq {
			seq = tag
		}
	}
	return seq, seq != 0
}
