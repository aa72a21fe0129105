package test

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// learnedError is a typed failure of the learned-policy test.
type learnedError struct{ typ string }

func (e learnedError) Error() string     { return e.typ + ": upstream said no" }
func (e learnedError) ErrorType() string { return e.typ }

// TestLearnedRetry is issue 36's point 6 on RabbitMQ: a stack with the learned policy
// dead-letters an error type that never recovers once it has the evidence, with the
// evidence in the dead letter's record; keeps retrying a type that recovers; resumes
// retrying the first type once its dependency is fixed; and its statistics match a ledger
// of what the test sent.
func TestLearnedRetry(t *testing.T) {
	e := rabbitEnv(t)
	queue := e.newQueue(t, "learned")
	stats, err := retrystats.New(retrystats.Config{})
	require.NoError(t, err)
	const minEvidence = 20
	var fixed atomic.Bool
	var mu sync.Mutex
	calls := map[string]int{}
	succeeded := map[string]int{}
	s := start(t, e, router.Config{Retry: retry.Config{
		MaxRetries: 3, InitialDelay: 20 * time.Millisecond, MaxDelay: 50 * time.Millisecond, Jitter: retry.NoJitter,
		Stats: stats, Learned: &retry.Learned{MinEvidence: minEvidence, Explore: 0.2},
	}}, func(s *router.Stack) {
		require.NoError(t, s.Handle("charge", queue, func(m *message.Message) error {
			kind, _, _ := strings.Cut(string(m.Payload), "-")
			mu.Lock()
			calls[m.UUID]++
			attempt := calls[m.UUID]
			mu.Unlock()
			var err error
			switch kind {
			case "upstream": // never recovers, until fixed: then once, like a timeout
				if !fixed.Load() || attempt < 2 {
					err = learnedError{"upstream_broken"}
				}
			case "timeout": // recovers at attempt 2
				if attempt < 2 {
					err = learnedError{"gateway_timeout"}
				}
			}
			if err == nil {
				mu.Lock()
				succeeded[m.UUID] = attempt
				mu.Unlock()
			}
			return err
		}))
	})
	_ = s

	// dead maps the DLQ's ids to their records, read as they arrive.
	dead := map[string]*message.Message{}
	send := func(kind string, n int) []string {
		t.Helper()
		ids := make([]string, n)
		for i := range ids {
			m := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "%s-%d", kind, i))
			ids[i] = m.UUID
			e.publish(t, queue, m)
		}
		require.Eventually(t, func() bool {
			for _, m := range e.dlq(t, queue) {
				dead[m.UUID] = m
			}
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				_, ok := succeeded[id]
				if _, gone := dead[id]; !ok && !gone {
					return false
				}
			}
			return true
		}, 60*time.Second, 20*time.Millisecond, "every %s message ended", kind)
		return ids
	}
	type tally struct{ succeeded, exhausted, unlikely, calls int }
	count := func(ids []string) tally {
		mu.Lock()
		defer mu.Unlock()
		var tl tally
		for _, id := range ids {
			tl.calls += calls[id]
			if _, ok := succeeded[id]; ok {
				tl.succeeded++
				continue
			}
			switch reason := dead[id].Metadata.Get(headers.DeadLetterReason); reason {
			case decide.ReasonRetryUnlikely:
				tl.unlikely++
			case decide.ReasonRetriesExhausted:
				tl.exhausted++
			default:
				t.Errorf("message %s dead-lettered with reason %q", id, reason)
			}
		}
		return tl
	}
	// Too little evidence: the base policy, 4 calls each.
	first := send("upstream", minEvidence)
	assert.Equal(t, tally{exhausted: minEvidence, calls: 4 * minEvidence}, count(first))

	// Evidence enough: dead-lettered at the first failure, but the explored share (20%,
	// chosen by message id), which still follows the base policy.
	later := send("upstream", 50)
	got := count(later)
	x := got.exhausted
	assert.Equal(t, tally{exhausted: x, unlikely: 50 - x, calls: 4*x + (50 - x)}, got)
	assert.InDelta(t, 12, x, 11, "about 20%% of 50 explored, and the probes")
	for _, id := range later {
		rec := dead[id]
		if rec.Metadata.Get(headers.DeadLetterReason) != decide.ReasonRetryUnlikely {
			continue
		}
		assert.Contains(t, rec.Metadata.Get(sluice.HeaderErrorMessage), fmt.Sprintf("retry_unlikely: 0 of %d recovered in the last hour (error type upstream_broken)", minEvidence),
			"the evidence is in the record")
		assert.Equal(t, "upstream_broken", rec.Metadata.Get(sluice.HeaderErrorType), "the record keeps the type, so a replay works as usual")
		break
	}

	// A type that recovers keeps being retried.
	timeouts := send("timeout", 30)
	assert.Equal(t, tally{succeeded: 30, calls: 60}, count(timeouts))

	// The statistics match the ledger. The retry step counts an outcome after the handler
	// returned and after a dead letter is confirmed, so the ledger can be a moment ahead.
	require.Eventually(t, func() bool {
		return stats.Type("charge", "upstream_broken").Messages >= minEvidence+50 &&
			stats.Type("charge", "gateway_timeout").Recovered >= 30
	}, 30*time.Second, 10*time.Millisecond, "the last outcomes counted")
	up := stats.Type("charge", "upstream_broken")
	assert.EqualValues(t, minEvidence+50, up.Messages, "messages that failed with the type")
	assert.EqualValues(t, 3*(minEvidence+x), up.Retries, "3 retries for each message the base policy ran")
	assert.EqualValues(t, minEvidence+x, up.Exhausted)
	assert.EqualValues(t, 50-x, up.Unlikely)
	assert.Zero(t, up.Recovered)
	to := stats.Type("charge", "gateway_timeout")
	assert.EqualValues(t, 30, to.Messages)
	assert.EqualValues(t, 30, to.Recovered)
	assert.Equal(t, 2, to.RecoveryAttempt(0.5), "median recovery at attempt 2")

	// The dependency is fixed: the explored messages recover, and the type is retried again.
	fixed.Store(true)
	var resumedAfter int
	require.Eventually(t, func() bool {
		resumedAfter += 10
		ids := send("upstream", 10)
		return count(ids).unlikely == 0 && count(ids).succeeded == 10
	}, 120*time.Second, 10*time.Millisecond, "retries of upstream_broken resumed after the fix")
	t.Logf("upstream_broken retried again after %d messages sent once fixed", resumedAfter)
}

// Issue 36: once the dependency heals, the messages the learned policy stopped are found by
// their dead-letter reason and replayed like any other dead letter; the ones whose retries
// ran out stay where they are.
func TestReplayRetryUnlikely(t *testing.T) {
	e := rabbitEnv(t)
	queue := e.newQueue(t, "learned-replay")
	stats, err := retrystats.New(retrystats.Config{})
	require.NoError(t, err)
	const minEvidence = 5
	var fixed atomic.Bool
	var mu sync.Mutex
	calls := map[string]int{}
	charged := map[string]int{}
	start(t, e, router.Config{Retry: retry.Config{
		MaxRetries: 2, InitialDelay: 20 * time.Millisecond, MaxDelay: 50 * time.Millisecond, Jitter: retry.NoJitter,
		Stats: stats, Learned: &retry.Learned{MinEvidence: minEvidence, Explore: retry.NoExplore},
	}}, func(s *router.Stack) {
		require.NoError(t, s.Handle("charge", queue, func(m *message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			calls[m.UUID]++
			if !fixed.Load() {
				return learnedError{"upstream_broken"}
			}
			charged[m.UUID]++
			return nil
		}))
	})
	send := func(n, wantDead int) []string {
		t.Helper()
		ids := make([]string, n)
		for i := range ids {
			m := message.NewMessage(watermill.NewUUID(), []byte("charge"))
			ids[i] = m.UUID
			e.publish(t, queue, m)
		}
		require.Eventually(t, func() bool { return e.count(t, topology.DLQ(queue)) == wantDead },
			60*time.Second, 20*time.Millisecond, "%d dead letters", wantDead)
		return ids
	}
	exhausted := send(minEvidence, minEvidence)
	stopped := send(10, minEvidence+10)
	mu.Lock()
	for _, id := range stopped {
		assert.Equal(t, 1, calls[id], "stopped at the first failure")
	}
	mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reasons := map[string]string{}
	_, err = dlq.Inspector{Conn: e.rabbit.Conn}.Messages(ctx, queue, dlq.Selector{}, func(r dlq.Record) bool {
		reasons[r.ID] = r.Reason
		return true
	})
	require.NoError(t, err)
	for _, id := range exhausted {
		assert.Equal(t, decide.ReasonRetriesExhausted, reasons[id])
	}
	for _, id := range stopped {
		assert.Equal(t, decide.ReasonRetryUnlikely, reasons[id])
	}

	fixed.Store(true)
	op := dlq.Operator{Conn: e.rabbit.Conn}
	res, err := op.Replay(ctx, queue, dlq.Selector{Reason: decide.ReasonRetryUnlikely}, dlq.Options{})
	require.NoError(t, err)
	assert.Len(t, res.IDs, 10)
	assert.ElementsMatch(t, stopped, res.IDs)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range stopped {
			if charged[id] != 1 {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "every replayed message is charged once")
	assert.Equal(t, minEvidence, e.count(t, topology.DLQ(queue)), "the exhausted ones stay in the DLQ")
	mu.Lock()
	defer mu.Unlock()
	for _, id := range exhausted {
		assert.Zero(t, charged[id])
	}
}

// Issue 36, the probe: with the default exploration (5% by message id), a stopped type
// still has one message in its retry path, marked with retry.HeaderProbe on its copies and
// through the broker's delay, so the first message sent after the fix recovers and the
// type is retried again at once, where the hashed share alone would dead-letter about 19
// messages first.
func TestLearnedRetryProbe(t *testing.T) {
	e := rabbitEnv(t)
	queue := e.newQueue(t, "learned-probe")
	const minEvidence = 10
	var fixed atomic.Bool
	var mu sync.Mutex
	calls := map[string]int{}
	marked := map[string]bool{}
	succeeded := map[string]bool{}
	s := start(t, e, router.Config{Retry: retry.Config{
		MaxRetries: 2, InitialDelay: 20 * time.Millisecond, MaxDelay: 50 * time.Millisecond, Jitter: retry.NoJitter,
		Learned: &retry.Learned{MinEvidence: minEvidence},
	}}, func(s *router.Stack) {
		require.NoError(t, s.Handle("charge", queue, func(m *message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			calls[m.UUID]++
			if m.Metadata.Get(retry.HeaderProbe) != "" {
				marked[m.UUID] = true
			}
			if !fixed.Load() || calls[m.UUID] < 2 {
				return learnedError{"upstream_broken"}
			}
			succeeded[m.UUID] = true
			return nil
		}))
	})
	dead := map[string]*message.Message{}
	// sendOne publishes a message whose id is outside the hashed share and waits until it
	// ended: only the probe can have it retried while the type is stopped.
	n := 0
	sendOne := func() string {
		t.Helper()
		var id string
		for {
			n++
			if id = fmt.Sprintf("probe-%d-%s", n, watermill.NewShortUUID()); !hashExplored(id) {
				break
			}
		}
		e.publish(t, queue, message.NewMessage(id, []byte("charge")))
		require.Eventually(t, func() bool {
			for _, m := range e.dlq(t, queue) {
				dead[m.UUID] = m
			}
			mu.Lock()
			defer mu.Unlock()
			return succeeded[id] || dead[id] != nil
		}, 30*time.Second, 10*time.Millisecond, "message %s ended", id)
		return id
	}
	reason := func(id string) string {
		if m := dead[id]; m != nil {
			return m.Metadata.Get(headers.DeadLetterReason)
		}
		return "recovered"
	}
	for range minEvidence {
		require.Equal(t, decide.ReasonRetriesExhausted, reason(sendOne()))
	}
	require.True(t, s.Retry().LearnedView("charge", "upstream_broken").Stopped)

	// Stopped: one message at a time, each ends before the next is sent after the rest
	// that follows a probe that did not recover (as long as it was in flight: well under
	// a second here), so each finds no explored message in flight and is the probe. Sent
	// together, only one is.
	for range 3 {
		id := sendOne()
		assert.Equal(t, decide.ReasonRetriesExhausted, reason(id), "the probe follows the base policy")
		mu.Lock()
		assert.Equal(t, 3, calls[id])
		assert.True(t, marked[id], "its copies came back through the broker marked")
		mu.Unlock()
		assert.Equal(t, "upstream_broken", dead[id].Metadata.Get(retry.HeaderProbe), "its dead letter says it was a probe")
		time.Sleep(time.Second)
	}
	burst := make([]string, 20)
	for i := range burst {
		for {
			n++
			if burst[i] = fmt.Sprintf("burst-%d-%s", n, watermill.NewShortUUID()); !hashExplored(burst[i]) {
				break
			}
		}
		e.publish(t, queue, message.NewMessage(burst[i], []byte("charge")))
	}
	require.Eventually(t, func() bool {
		for _, m := range e.dlq(t, queue) {
			dead[m.UUID] = m
		}
		for _, id := range burst {
			if dead[id] == nil {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond)
	var probes int
	for _, id := range burst {
		if reason(id) == decide.ReasonRetriesExhausted {
			probes++
		}
	}
	assert.GreaterOrEqual(t, probes, 1, "a probe among the burst")
	assert.Less(t, probes, 10, "one at a time, not every message")

	fixed.Store(true)
	time.Sleep(time.Second) // past the rest after the burst's last probe
	first := sendOne()
	assert.Equal(t, "recovered", reason(first), "the first message after the fix is the probe and recovers")
	v := s.Retry().LearnedView("charge", "upstream_broken")
	assert.False(t, v.Stopped, v.Reason)
	assert.Equal(t, "recovered", reason(sendOne()), "retried again")
}

// hashExplored reports whether the learned policy explores message id by its hash at the
// default 5%: FNV-1a of the id, as documented on retry.Learned.
func hashExplored(id string) bool {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return h.Sum32()%10000 < 500
}
