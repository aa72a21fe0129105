package memory

import (
	"container/heap"
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
)

// Delay delivers a copy of msg to queue after d, by the scheduler.
func (b *Broker) Delay(_ context.Context, queue string, d time.Duration, msg *message.Message) error {
	if b.closed() {
		return broker.ErrClosed
	}
	b.mu.Lock()
	heap.Push(&b.sched, scheduled{due: time.Now().Add(d), queue: queue, msg: copyMessage(msg)})
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	return nil
}

type scheduled struct {
	due   time.Time
	queue string
	msg   *message.Message
}

type scheduleHeap []scheduled

func (h scheduleHeap) Len() int           { return len(h) }
func (h scheduleHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h scheduleHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *scheduleHeap) Push(x any)        { *h = append(*h, x.(scheduled)) }
func (h *scheduleHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// idleWait is how long the scheduler's timer waits with nothing scheduled; a Delay wakes it
// at once, so the value only bounds an idle loop.
const idleWait = time.Hour

// runScheduler moves due messages into their queues. One timer, reset to the earliest due
// time, serves every delay: a long delay never holds back a short one.
func (b *Broker) runScheduler() {
	defer b.wg.Done()
	timer := time.NewTimer(idleWait)
	defer timer.Stop()
	for {
		b.mu.Lock()
		now := time.Now()
		var due []scheduled
		for len(b.sched) > 0 && !b.sched[0].due.After(now) {
			due = append(due, heap.Pop(&b.sched).(scheduled))
		}
		next := idleWait
		if len(b.sched) > 0 {
			next = b.sched[0].due.Sub(now)
		}
		b.mu.Unlock()
		for _, s := range due {
			b.queue(s.queue).push(s.msg, false)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
		select {
		case <-b.closing:
			return
		case <-b.wake:
		case <-timer.C:
		}
	}
}
