package amqp

import (
	"log/slog"
	"slices"
	"sync"
	"time"
)

// acknowledger is the part of *amqp091.Channel an acker uses.
type acknowledger interface {
	Ack(tag uint64, multiple bool) error
}

// acker settles one channel's deliveries with as few basic.ack frames as it can. RabbitMQ
// handles a basic.ack with multiple set, which acks every unacked tag up to its own, for
// about the cost of a single one, so acks that are ready close together leave as one frame:
// on a 2-core broker that is about a third more deliveries a second than one ack each.
//
// An ack waits at most delay for others to join it, and not at all once batch acks are
// waiting: a waiting ack holds a prefetch slot, so batch is what the prefetch has to spare
// beyond the handlers. A multiple ack may cover only tags that are settled: acked in this
// batch, or already acked or nacked on their own. Delivery tags on a channel are
// consecutive, so every tag below one seen settled is either settled or still with a
// handler; the acker keeps the latter (gaps, at most the prefetch count) and sends
// multiple up to the highest acked tag below the lowest gap. An acked tag above a gap
// waits one more round for the gap to close (with several handlers there is nearly always
// an older message still running), then leaves on its own: a slow message never holds
// the others' acks back for longer than two delays.
type acker struct {
	ch     acknowledger
	batch  int
	delay  time.Duration
	logger *slog.Logger
	queue  string

	mu      sync.Mutex
	acks    []uint64 // acked by handlers, not yet sent
	nacks   []uint64 // nacked by the subscriber, already sent
	nHeld   int      // len(held), for settle: held acks take prefetch slots too
	wake    chan struct{}
	stop    chan struct{}
	stopped chan struct{}

	gateGrace time.Duration
	gateStop  chan struct{}
	// gates are the deliveries whose ack waits for a gate (see gate), in order; gating
	// says a runGates goroutine runs them, and gateRunner counts it: close waits for it
	// up to gateGrace, then closes gateStop to end the waits left.
	gateMu     sync.Mutex
	gates      []heldAck
	gating     bool
	gateRunner sync.WaitGroup

	// Owned by the run goroutine.
	hi    uint64              // highest settled tag seen
	gaps  map[uint64]struct{} // unsettled tags below hi
	held  []uint64            // acks above a gap at the last flush
	spare []uint64
	todo  []uint64
}

// newAcker starts an acker for ch. batch < 2 or delay <= 0 send every ack at once, from
// the caller's goroutine.
func newAcker(ch acknowledger, batch int, delay time.Duration, logger *slog.Logger, queue string) *acker {
	if batch < 1 || delay <= 0 {
		batch = 1
	}
	a := &acker{
		ch: ch, batch: batch, delay: delay, logger: logger, queue: queue,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{}),
		gaps: make(map[uint64]struct{}), gateStop: make(chan struct{}),
	}
	if batch == 1 {
		close(a.stopped) // nothing to gather: no goroutine
		return a
	}
	go a.run()
	return a
}

// gate runs wait, a step's broker.Delivery.HoldAck, off the caller's goroutine, then settle with
// its result; close waits for it. Meanwhile tag is unsettled, a gap no multiple ack covers.
//
// The waits of one channel run one after the other, in the order they came, on one
// goroutine that lives while any is queued: the idempotency journal confirms its records
// in the order they were sent, so when one round's confirm arrives the waits behind the
// first of it return at once, and a round costs one wake-up instead of a goroutine and a
// wake-up per message.
func (a *acker) gate(wait func(stop <-chan struct{}) error, settle func(error)) {
	a.gateMu.Lock()
	a.gates = append(a.gates, heldAck{wait: wait, settle: settle})
	if a.gating {
		a.gateMu.Unlock()
		return
	}
	a.gating = true
	a.gateRunner.Add(1)
	a.gateMu.Unlock()
	go a.runGates()
}

// heldAck is a queued gate.
type heldAck struct {
	wait   func(stop <-chan struct{}) error
	settle func(error)
}

// runGates runs the queued gates in order until none is left.
func (a *acker) runGates() {
	defer a.gateRunner.Done()
	for {
		a.gateMu.Lock()
		if len(a.gates) == 0 {
			a.gating = false
			a.gateMu.Unlock()
			return
		}
		g := a.gates[0]
		a.gates[0] = heldAck{}
		a.gates = a.gates[1:]
		a.gateMu.Unlock()
		g.settle(g.wait(a.gateStop))
	}
}

// ack queues tag's basic.ack.
func (a *acker) ack(tag uint64) {
	if a.batch == 1 {
		a.send(tag, false)
		return
	}
	a.settle(tag, true)
}

// nacked records that tag's basic.nack (or reject) was sent, so the tag no longer holds
// back the acks above it.
func (a *acker) nacked(tag uint64) {
	if a.batch > 1 {
		a.settle(tag, false)
	}
}

func (a *acker) settle(tag uint64, ack bool) {
	a.mu.Lock()
	if ack {
		a.acks = append(a.acks, tag)
	} else {
		a.nacks = append(a.nacks, tag)
	}
	n := len(a.acks) + len(a.nacks)
	full := n+a.nHeld >= a.batch
	a.mu.Unlock()
	// The first settle opens a batch, the one that makes batch acks wait (held ones
	// included) closes it; in between nobody waits on the goroutine.
	if n == 1 || full {
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
}

// close sends every queued ack and stops the goroutine. Call it after the last settle and
// before the channel closes.
func (a *acker) close() {
	gated := make(chan struct{})
	go func() {
		a.gateRunner.Wait() // it returns once no gate is left
		close(gated)
	}()
	grace := time.NewTimer(a.gateGrace)
	select {
	case <-gated:
	case <-grace.C:
		close(a.gateStop) // the held acks give their messages back
		<-gated
	}
	grace.Stop()
	if a.batch > 1 {
		close(a.stop)
	}
	<-a.stopped
}

func (a *acker) run() {
	defer close(a.stopped)
	// Stopped: whatever waits leaves now, the held acks one by one.
	defer func() {
		a.flush()
		a.flushHeld()
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		if len(a.held) == 0 {
			select {
			case <-a.wake:
			case <-a.stop:
				return
			}
		}
		if !a.gather(timer) {
			return
		}
		a.flush()
	}
}

// gather waits until batch acks wait or delay has passed. It reports false when the acker
// was stopped meanwhile.
func (a *acker) gather(timer *time.Timer) bool {
	if a.pending() >= a.batch {
		return true
	}
	timer.Reset(a.delay)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
			return true
		case <-a.wake:
			if a.pending() >= a.batch {
				return true
			}
		case <-a.stop:
			return false
		}
	}
}

// pending is how many acks and nacks wait, held ones included.
func (a *acker) pending() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.acks) + len(a.nacks) + a.nHeld
}

// flush sends the queued acks and those held since the last flush: one multiple ack for
// all below the lowest gap, then the held ones still above it one each; new ones above it
// are held for the next flush.
func (a *acker) flush() {
	a.mu.Lock()
	acks, nacks := a.acks, a.nacks
	a.acks, a.nacks = a.spare[:0], nil
	a.mu.Unlock()
	if len(acks) == 0 && len(nacks) == 0 && len(a.held) == 0 {
		a.spare = acks
		return
	}

	// Walk every newly settled tag in order, so tags settled in this batch never count
	// as gaps.
	a.todo = append(append(a.todo[:0], acks...), nacks...)
	slices.Sort(a.todo)
	for _, t := range a.todo {
		switch {
		case t > a.hi:
			for g := a.hi + 1; g < t; g++ {
				a.gaps[g] = struct{}{}
			}
			a.hi = t
		default:
			delete(a.gaps, t)
		}
	}
	low := a.hi + 1
	for g := range a.gaps {
		low = min(low, g)
	}

	// The highest ack below the lowest gap, new or held, covers every one below it.
	var top uint64
	covered := 0
	for _, ts := range [2][]uint64{acks, a.held} {
		for _, t := range ts {
			if t < low {
				top = max(top, t)
				covered++
			}
		}
	}
	if covered > 0 {
		a.send(top, covered > 1)
	}
	// Held ones still above the gap have waited their round.
	for _, t := range a.held {
		if t > low {
			a.send(t, false)
		}
	}
	a.held = a.held[:0]
	for _, t := range acks {
		if t > low {
			a.held = append(a.held, t)
		}
	}
	a.mu.Lock()
	a.nHeld = len(a.held)
	a.mu.Unlock()
	a.spare = acks
}

// flushHeld sends the held acks one each: the last flush has run and the channel closes.
func (a *acker) flushHeld() {
	for _, t := range a.held {
		a.send(t, false)
	}
	a.held = a.held[:0]
}

func (a *acker) send(tag uint64, multiple bool) {
	if err := a.ch.Ack(tag, multiple); err != nil {
		// The channel is gone and RabbitMQ requeued its unacked deliveries itself.
		a.logger.Warn("ack failed; RabbitMQ will redeliver", "queue", a.queue, "delivery_tag", tag, "multiple", multiple, "error", err)
	}
}
