package test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// The failure mix of BenchmarkLearnedRetry (issue 36, point 5), drawn with one seed for
// both policies: per 100 messages, 40 transient timeouts (recover at attempt 2 nine times
// in ten, else at attempt 3), 20 untyped upstream errors (never recover until the fix
// half-way, then at attempt 2), 20 rate limited (recover at attempt 4), 20 that succeed.
const (
	learnedBenchMessages = 2000
	learnedBenchRate     = 125 // messages a second
	learnedBenchWindow   = 4 * time.Second
)

// errUpstream is the untyped upstream error: its type is whatever sluice names an error
// without one.
var errUpstream = errors.New("upstream: 502 bad gateway")

type mixMessage struct {
	kind    string // timeout, upstream, rate, ok
	recover int    // the attempt it succeeds at (upstream: before the fix, never)
}

func learnedMix(seed uint64) []mixMessage {
	rng := rand.New(rand.NewPCG(seed, seed))
	out := make([]mixMessage, learnedBenchMessages)
	for i := range out {
		switch p := rng.IntN(100); {
		case p < 40:
			out[i] = mixMessage{kind: "timeout", recover: 2}
			if rng.IntN(10) == 0 {
				out[i].recover = 3
			}
		case p < 60:
			out[i] = mixMessage{kind: "upstream", recover: 2}
		case p < 80:
			out[i] = mixMessage{kind: "rate", recover: 4}
		default:
			out[i] = mixMessage{kind: "ok", recover: 1}
		}
	}
	return out
}

// BenchmarkLearnedRetry runs the same failure mix through a stack on RabbitMQ with the
// fixed policy (4 retries, 10-50 ms) and with the learned policy on top of it (evidence
// minimum 50, exploring the default 5%, and 20%; a 4 s statistics window), 2,000 messages at 125 a second, the
// never-recovering dependency fixed half-way. It reports the dependency calls spent on
// retries of messages that never recovered (wasted-calls), recoverable messages
// dead-lettered (recoverable-dlq), the time from the fix until the learned policy retries
// the type again (resume-ms: 0 for the fixed policy, which never stopped) and the heap the
// retry statistics and policy hold after the run (stats-heap-B).
//
// LEARNED_BENCH_SEED (default 42) draws another mix, the same for every policy of the run.
func BenchmarkLearnedRetry(b *testing.B) {
	seed := uint64(42)
	if v := os.Getenv("LEARNED_BENCH_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			b.Fatalf("LEARNED_BENCH_SEED %q: %v", v, err)
		}
		seed = n
	}
	mix := learnedMix(seed)
	for _, tc := range []struct {
		name    string
		learned *retry.Learned
	}{
		{"fixed", nil},
		{"learned", &retry.Learned{MinEvidence: 50}},
		{"learned-explore-20", &retry.Learned{MinEvidence: 50, Explore: 0.2}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				runLearnedMix(b, mix, tc.learned)
			}
		})
	}
}

func runLearnedMix(b *testing.B, mix []mixMessage, learned *retry.Learned) {
	e := rabbitEnv(b)
	queue := e.newQueue(b, "bench.learned")
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	stats, err := retrystats.New(retrystats.Config{Window: learnedBenchWindow})
	if err != nil {
		b.Fatal(err)
	}
	rcfg := retry.Config{MaxRetries: 4, InitialDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, Jitter: retry.NoJitter, Stats: stats}
	if learned != nil {
		l := *learned
		rcfg.Learned = &l
	}
	var fixed atomic.Bool
	var mu sync.Mutex
	calls := map[string]int{}
	kinds := map[string]mixMessage{}
	done := map[string]bool{} // succeeded
	ended := atomic.Int64{}
	s := start(b, e, router.Config{Retry: rcfg, Logger: testLogger()}, func(s *router.Stack) {
		if err := s.Handle("charge", queue, func(m *message.Message) error {
			mu.Lock()
			calls[m.UUID]++
			attempt := calls[m.UUID]
			mm := kinds[m.UUID]
			mu.Unlock()
			var err error
			switch {
			case mm.kind == "upstream" && !fixed.Load():
				err = errUpstream
			case attempt < mm.recover:
				err = learnedError{typ: map[string]string{"timeout": "gateway_timeout", "upstream": "", "rate": "rate_limited"}[mm.kind]}
				if mm.kind == "upstream" {
					err = errUpstream
				}
			}
			if err == nil {
				mu.Lock()
				done[m.UUID] = true
				mu.Unlock()
				ended.Add(1)
			}
			return err
		}); err != nil {
			b.Fatal(err)
		}
	})
	upstreamType := sluice.ErrorType(errUpstream)

	b.ResetTimer()
	start := time.Now()
	ids := make([]string, len(mix))
	// Resuming: from the fix until the learned view of the upstream type says it is
	// retried again, polled beside the publishing.
	resumed := make(chan time.Duration, 1)
	stopPoll := make(chan struct{})
	defer close(stopPoll)
	tick := time.NewTicker(time.Second / learnedBenchRate)
	for i, mm := range mix {
		<-tick.C
		if i == len(mix)/2 {
			fixed.Store(true)
			fixedAt := time.Now()
			if learned != nil {
				go func() {
					poll := time.NewTicker(5 * time.Millisecond)
					defer poll.Stop()
					for {
						select {
						case <-stopPoll:
							return
						case <-poll.C:
						}
						if v := s.Retry().LearnedView("charge", upstreamType); !v.Stopped {
							resumed <- time.Since(fixedAt)
							return
						}
					}
				}()
			}
		}
		m := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "%s-%d", mm.kind, i))
		ids[i] = m.UUID
		mu.Lock()
		kinds[m.UUID] = mm
		mu.Unlock()
		e.publish(b, queue, m)
	}
	tick.Stop()
	var resume time.Duration
	if learned != nil {
		select {
		case resume = <-resumed:
		case <-time.After(4 * learnedBenchWindow):
			b.Errorf("retries of %s did not resume within %s of the end of the run", upstreamType, 4*learnedBenchWindow)
		}
	}
	// Every message ends: succeeded or dead-lettered.
	dead := map[string]bool{}
	deadline := time.Now().Add(2 * time.Minute)
	for len(dead)+int(ended.Load()) < len(mix) && time.Now().Before(deadline) {
		for _, m := range e.dlq(b, queue) {
			dead[m.UUID] = true
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	if n := len(dead) + int(ended.Load()); n != len(mix) {
		b.Fatalf("%d of %d messages ended", n, len(mix))
	}
	var wasted, recoverableDead int
	mu.Lock()
	for i, id := range ids {
		if !dead[id] {
			continue
		}
		wasted += calls[id] - 1 // every retry of a message that never recovered
		// Recoverable under the fixed policy: a timeout or a rate limit (within its 4
		// retries), or an upstream message sent after the fix.
		if mm := kinds[id]; mm.kind != "upstream" || i >= len(mix)/2 {
			recoverableDead++
		}
	}
	mu.Unlock()
	_ = s
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(wasted), "wasted-calls")
	b.ReportMetric(float64(recoverableDead), "recoverable-dlq")
	b.ReportMetric(float64(resume.Milliseconds()), "resume-ms")
	b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse)), "heap-delta-B")
	b.ReportMetric(elapsed.Seconds(), "run-s")
}
