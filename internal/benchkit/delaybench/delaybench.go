// Package delaybench measures how exactly a broker delays messages, for the
// DelayAccuracy benchmarks of broker/amqp and broker/memory: the same measurement on both
// brokers, so their figures compare.
package delaybench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// payload is the 1 KiB body of every delayed message.
var payload = make([]byte, 1024)

// Rounds of delays: n delays spread geometrically from lo to hi.
const (
	n      = 240
	lo, hi = 100 * time.Millisecond, 20 * time.Second
	// aloneGap separates the hand-offs of a round handed off one at a time.
	aloneGap = 10 * time.Millisecond
)

// Measure runs b.N rounds of 240 delays spread geometrically from 100ms to 20s, handed to
// delay at once, reads them back from msgs, and reports how late each arrived (actual minus
// requested, from just before the delay call to the delivery: p50, p99 and max) and the
// p99 of the delay call itself, in milliseconds.
func Measure(ctx context.Context, b *testing.B, msgs <-chan *message.Message, delay func(time.Duration, *message.Message) error) {
	measure(ctx, b, msgs, delay, false)
}

// MeasureWarm is Measure after one round at once that is not measured: the lateness of a
// burst on a broker that has delayed before (its delay queues declared, its channel used).
func MeasureWarm(ctx context.Context, b *testing.B, msgs <-chan *message.Message, delay func(time.Duration, *message.Message) error) {
	b.StopTimer()
	delayRound(ctx, b, msgs, delay, false)
	measure(ctx, b, msgs, delay, false)
}

// MeasureAlone is MeasureWarm with each measured round's delays handed off one at a time,
// aloneGap after the previous one was confirmed: the lateness of a delay that no other
// hand-off competes with.
func MeasureAlone(ctx context.Context, b *testing.B, msgs <-chan *message.Message, delay func(time.Duration, *message.Message) error) {
	b.StopTimer()
	delayRound(ctx, b, msgs, delay, false)
	measure(ctx, b, msgs, delay, true)
}

func measure(ctx context.Context, b *testing.B, msgs <-chan *message.Message, delay func(time.Duration, *message.Message) error, alone bool) {
	var late, handoff []time.Duration
	// MeasureWarm and MeasureAlone stop the timer for their first round; ResetTimer does
	// not start it again, and a benchmark timed at zero is run again with a larger b.N
	// (100 rounds of 20 s: past the caller's deadline).
	b.ResetTimer()
	b.StartTimer()
	for i := 0; i < b.N; i++ {
		l, h := delayRound(ctx, b, msgs, delay, alone)
		late, handoff = append(late, l...), append(handoff, h...)
	}
	b.StopTimer()
	reportLateness(b, late, handoff)
}

// delays returns a round's delays in random order.
func delays() []time.Duration {
	delays := make([]time.Duration, n)
	for i := range delays {
		delays[i] = time.Duration(float64(lo) * math.Pow(float64(hi)/float64(lo), float64(i)/float64(n-1)))
	}
	rand.Shuffle(n, func(i, j int) { delays[i], delays[j] = delays[j], delays[i] })
	return delays
}

// delayRound delays 240 messages, at once or one at a time, and returns how late each
// arrived and how long each Delay call took.
func delayRound(ctx context.Context, b *testing.B, msgs <-chan *message.Message, delay func(time.Duration, *message.Message) error, alone bool) (late, handoff []time.Duration) {
	type sent struct {
		at        time.Time
		requested time.Duration
	}
	var mu sync.Mutex
	sentAt := make(map[string]sent, n)

	// Deliveries are read while the hand-offs are still being made: a short delay handed
	// off early arrives before the last hand-off (one at a time, they take seconds).
	type result struct {
		late []time.Duration
		err  string
	}
	read := make(chan result, 1)
	go func() {
		got := make([]time.Duration, 0, n)
		deadline := time.After(hi + time.Minute)
		for len(got) < n {
			select {
			case m, ok := <-msgs:
				if !ok {
					read <- result{err: fmt.Sprintf("subscription closed after %d of %d delayed messages", len(got), n)}
					return
				}
				arrived := time.Now()
				m.Ack()
				mu.Lock()
				s, ok := sentAt[m.UUID]
				delete(sentAt, m.UUID)
				mu.Unlock()
				if ok { // a redelivered duplicate is not measured twice
					got = append(got, arrived.Sub(s.at)-s.requested)
				}
			case <-deadline:
				read <- result{err: fmt.Sprintf("only %d of %d delayed messages arrived", len(got), n)}
				return
			case <-ctx.Done():
				read <- result{err: ctx.Err().Error()}
				return
			}
		}
		read <- result{late: got}
	}()

	errs := make(chan error, n)
	handoffs := make(chan time.Duration, n)
	var wg sync.WaitGroup
	for i, d := range delays() {
		wg.Add(1)
		one := func() {
			defer wg.Done()
			m := message.NewMessage(fmt.Sprintf("delay-%d-%s", i, watermill.NewShortUUID()), payload)
			start := time.Now()
			mu.Lock()
			sentAt[m.UUID] = sent{at: start, requested: d}
			mu.Unlock()
			if err := delay(d, m); err != nil {
				errs <- err
				return
			}
			handoffs <- time.Since(start)
		}
		if alone {
			one()
			time.Sleep(aloneGap)
			continue
		}
		go one()
	}
	wg.Wait()
	close(errs)
	close(handoffs)
	for err := range errs {
		b.Fatal(err)
	}
	for h := range handoffs {
		handoff = append(handoff, h)
	}
	res := <-read
	if res.err != "" {
		b.Fatal(res.err)
	}
	return res.late, handoff
}

// reportLateness reports p50, p99 and max of late and p99 of handoff, in milliseconds.
func reportLateness(b *testing.B, late, handoff []time.Duration) {
	b.ReportMetric(percentileMS(late, 0.50), "p50-late-ms")
	b.ReportMetric(percentileMS(late, 0.99), "p99-late-ms")
	b.ReportMetric(percentileMS(late, 1), "max-late-ms")
	b.ReportMetric(percentileMS(handoff, 0.99), "p99-handoff-ms")
}

// percentileMS returns the p-quantile of ds (nearest rank) in milliseconds.
func percentileMS(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	i := int(math.Ceil(p*float64(len(ds)))) - 1
	return float64(ds[max(i, 0)]) / float64(time.Millisecond)
}
