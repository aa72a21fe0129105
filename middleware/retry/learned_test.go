package retry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/middleware/retry"
)

// typed is a handler error naming its type.
type typed string

func (e typed) Error() string     { return string(e) + " failed" }
func (e typed) ErrorType() string { return string(e) }

// loop runs the retry step in a Watermill router over gochannel whose delay hands the
// copy back to the queue at once: every message's whole journey, in memory.
type loop struct {
	t     *testing.T
	pub   *gochannel.GoChannel
	r     *retry.Retry
	fixed atomic.Bool // the "upstream" dependency is fixed: its messages succeed

	mu        sync.Mutex
	succeeded map[string]int   // payload -> attempt
	dead      map[string]error // payload -> dead-letter reason
	calls     map[string]int   // payload -> handler calls
	probes    map[string]bool  // the messages that arrived marked as the learned policy's probe
	// acked: the messages whose success the retry step has reported to its observers, which
	// it does after the learned policy counted it.
	acked map[string]bool
}

type loopDelayer struct{ l *loop }

func (d loopDelayer) Delay(_ context.Context, queue string, _ time.Duration, msg *message.Message) error {
	return d.l.pub.Publish(queue, msg)
}

type loopDead struct{ l *loop }

func (d loopDead) DeadLetter(context.Context, string, *message.Message) error { return nil }

func newLoop(t *testing.T, cfg retry.Config) *loop {
	t.Helper()
	l := &loop{t: t, succeeded: map[string]int{}, dead: map[string]error{}, calls: map[string]int{}, probes: map[string]bool{}, acked: map[string]bool{}}
	logger := watermill.NopLogger{}
	l.pub = gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024}, logger)
	deadObs := disposition.ObserverFunc(func(_ context.Context, o disposition.Outcome) {
		switch o.Disposition.Kind {
		case disposition.DeadLetter:
			l.mu.Lock()
			defer l.mu.Unlock()
			l.dead[o.MessageID] = o.Disposition.Reason
		case disposition.Ack:
			l.mu.Lock()
			defer l.mu.Unlock()
			l.acked[o.MessageID] = true
		}
	})
	if cfg.Observer != nil {
		cfg.Observer = disposition.Observers{deadObs, cfg.Observer}
	} else {
		cfg.Observer = deadObs
	}
	cfg.DeadLetterer, cfg.Delayer = loopDead{l}, loopDelayer{l}
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Jitter = retry.NoJitter
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = 3
	}
	var err error
	l.r, err = retry.New(cfg)
	require.NoError(t, err)

	serve(t, l.pub, l.r, l.handle)
	return l
}

// serve runs r over h in a Watermill router consuming queueName from pub, until t ends.
func serve(t *testing.T, pub *gochannel.GoChannel, r *retry.Retry, h message.HandlerFunc) {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddConsumerHandler(handlerName, queueName, pub, func(msg *message.Message) error {
		_, err := r.Middleware(h)(msg)
		return err
	})
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	<-router.Running()
	t.Cleanup(func() {
		require.NoError(t, router.Close())
		require.NoError(t, <-done)
		require.NoError(t, pub.Close())
	})
}

// handle fails by the payload's kind: "upstream" never recovers (once fixed, it recovers
// at attempt 2), "timeout" recovers at attempt 2, "permanent" is Permanent.
func (l *loop) handle(msg *message.Message) ([]*message.Message, error) {
	kind, _, _ := strings.Cut(string(msg.Payload), "-")
	attempt := sluice.RetryCount(msg.Metadata) + 1
	l.mu.Lock()
	l.calls[msg.UUID]++
	if msg.Metadata.Get(retry.HeaderProbe) != "" {
		l.probes[msg.UUID] = true
	}
	l.mu.Unlock()
	var err error
	switch kind {
	case "upstream":
		// Fixed, the dependency fails as a transient one does: once.
		if !l.fixed.Load() || attempt < 2 {
			err = typed("upstream")
		}
	case "timeout":
		if attempt < 2 {
			err = typed("timeout")
		}
	case "late": // the same type, recovering later
		if attempt < 3 {
			err = typed("timeout")
		}
	case "permanent":
		err = sluice.Permanent(typed("bad_record"))
	}
	if err == nil {
		l.mu.Lock()
		l.succeeded[msg.UUID] = attempt
		l.mu.Unlock()
	}
	return nil, err
}

// send publishes n messages of kind and waits until every one ended, as the retry step's
// observers are told (after the learned policy counted it: the handler's own return comes
// before that); it returns their ids.
func (l *loop) send(kind string, n int) []string {
	l.t.Helper()
	ids := make([]string, n)
	for i := range ids {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "%s-%d", kind, i))
		ids[i] = msg.UUID
		require.NoError(l.t, l.pub.Publish(queueName, msg))
	}
	require.Eventually(l.t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, id := range ids {
			_, dead := l.dead[id]
			if !l.acked[id] && !dead {
				return false
			}
		}
		return true
	}, 30*time.Second, 5*time.Millisecond)
	return ids
}

// explored counts the messages of ids that followed the base policy though their type was
// stopped: the hashed share, and the probes.
func (l *loop) explored(ids []string, share float64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int
	for _, id := range ids {
		if retry.Explored(id, share) || l.probes[id] {
			n++
		}
	}
	return n
}

// tally is what happened to a set of messages.
type tally struct{ succeeded, exhausted, unlikely, permanent, calls int }

func (l *loop) tally(ids []string) tally {
	l.mu.Lock()
	defer l.mu.Unlock()
	var t tally
	for _, id := range ids {
		t.calls += l.calls[id]
		if _, ok := l.succeeded[id]; ok {
			t.succeeded++
			continue
		}
		switch err := l.dead[id]; {
		case errors.Is(err, disposition.ErrRetryUnlikely):
			t.unlikely++
		case errors.Is(err, disposition.ErrRetriesExhausted):
			t.exhausted++
		default:
			t.permanent++
		}
	}
	return t
}

// With enough evidence that "upstream" never recovers, its messages are dead-lettered at
// once with the evidence in the record; "timeout" keeps being retried; a Permanent error
// is dead-lettered as ever.
func TestLearned_StopsRetryingWhatNeverRecovers(t *testing.T) {
	l := newLoop(t, retry.Config{Learned: &retry.Learned{MinEvidence: 20, Explore: retry.NoExplore}})
	first := l.send("upstream", 20)
	assert.Equal(t, tally{exhausted: 20, calls: 20 * 4}, l.tally(first), "too little evidence: the base policy")

	later := l.send("upstream", 30)
	assert.Equal(t, tally{unlikely: 30, calls: 30}, l.tally(later), "dead-lettered at their first failure")
	l.mu.Lock()
	reason := l.dead[later[0]]
	l.mu.Unlock()
	assert.Contains(t, reason.Error(), "retry_unlikely: 0 of 20 recovered in the last hour (error type upstream)")
	assert.Equal(t, "upstream", sluice.ErrorType(reason), "the record keeps the type")

	timeouts := l.send("timeout", 30)
	assert.Equal(t, tally{succeeded: 30, calls: 60}, l.tally(timeouts), "a recovering type is retried")
	perm := l.send("permanent", 5)
	assert.Equal(t, tally{permanent: 5, calls: 5}, l.tally(perm))

	v := l.r.LearnedView(handlerName, "upstream")
	assert.True(t, v.Stopped, v.Reason)
	assert.EqualValues(t, 20, v.Ended)
	assert.EqualValues(t, 30, v.Unlikely)
	assert.False(t, l.r.LearnedView(handlerName, "timeout").Stopped)
}

// A share of a stopped type's messages still follows the base policy; when the
// dependency is fixed, their recoveries make the type retried again.
func TestLearned_ExploresAndResumesAfterTheFix(t *testing.T) {
	l := newLoop(t, retry.Config{Learned: &retry.Learned{MinEvidence: 20, Explore: 0.2}})
	l.send("upstream", 40) // evidence, part of it from explored messages
	require.True(t, l.r.LearnedView(handlerName, "upstream").Stopped)

	ids := l.send("upstream", 200)
	explored := l.explored(ids, 0.2)
	got := l.tally(ids)
	assert.Equal(t, explored, got.exhausted, "the explored share and the probes followed the base policy")
	assert.Equal(t, 200-explored, got.unlikely)
	assert.InDelta(t, 40, explored, 30, "about 20%% of 200, and the probes")

	l.fixed.Store(true)
	// The explored share recovers at attempt 2; once recoveries reach 1%, every message
	// of the type is retried again.
	require.Eventually(t, func() bool {
		l.send("upstream", 10)
		return !l.r.LearnedView(handlerName, "upstream").Stopped
	}, 30*time.Second, time.Millisecond)
}

// Once stopped, a type stays stopped as the window ages past the evidence that stopped it:
// its own dead letters are no evidence, so judging it afresh would spend MinEvidence more
// messages' retries every window. Only an explored message's recovery resumes it.
func TestLearned_StaysStoppedAsTheEvidenceAges(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC).UnixNano())
	stats, err := retrystats.New(retrystats.Config{Window: time.Minute, Now: func() time.Time { return time.Unix(0, now.Load()) }})
	require.NoError(t, err)
	l := newLoop(t, retry.Config{Stats: stats, Learned: &retry.Learned{MinEvidence: 20, Explore: 0.2}})
	l.send("upstream", 20)
	l.send("upstream", 10) // judged stopped
	require.True(t, l.r.LearnedView(handlerName, "upstream").Stopped)

	now.Add(int64(2 * time.Minute)) // the 20 messages' evidence is out of the window
	ids := l.send("upstream", 50)
	explored := l.explored(ids, 0.2)
	got := l.tally(ids)
	assert.Equal(t, 50-explored, got.unlikely, "still dead-lettered at once")
	assert.Equal(t, explored, got.exhausted, "the explored share and the probes followed the base policy")
	v := l.r.LearnedView(handlerName, "upstream")
	assert.True(t, v.Stopped, v.Reason)
	assert.Less(t, v.Ended, int64(20), "below the evidence minimum, and still stopped")

	l.fixed.Store(true)
	require.Eventually(t, func() bool {
		l.send("upstream", 10)
		return !l.r.LearnedView(handlerName, "upstream").Stopped
	}, 30*time.Second, time.Millisecond, "an explored recovery resumes it")
}

// The policy does nothing for a type with too little evidence, however badly it does.
func TestLearned_TooLittleEvidence(t *testing.T) {
	l := newLoop(t, retry.Config{Learned: &retry.Learned{MinEvidence: 1000}})
	ids := l.send("upstream", 30)
	assert.Equal(t, tally{exhausted: 30, calls: 30 * 4}, l.tally(ids))
	v := l.r.LearnedView(handlerName, "upstream")
	assert.False(t, v.Stopped)
	assert.Contains(t, v.Reason, "too little evidence (30 of 1000")
}

// Types past the statistics' MaxTypes are never judged: _OTHER mixes them.
func TestLearned_NeverJudgesOther(t *testing.T) {
	stats, err := retrystats.New(retrystats.Config{MaxTypes: 1})
	require.NoError(t, err)
	l := newLoop(t, retry.Config{Stats: stats, Learned: &retry.Learned{MinEvidence: 5, Explore: retry.NoExplore}})
	l.send("timeout", 5)
	ids := l.send("upstream", 20)
	assert.Equal(t, tally{exhausted: 20, calls: 20 * 4}, l.tally(ids))
	v := l.r.LearnedView(handlerName, "upstream")
	assert.True(t, v.Other)
	assert.False(t, v.Stopped, v.Reason)
}

func TestLearned_Validation(t *testing.T) {
	tests := []struct {
		name    string
		learned retry.Learned
		want    string
		check   func(t *testing.T, l retry.Learned)
	}{
		{name: "zero is the defaults", check: func(t *testing.T, l retry.Learned) {
			assert.EqualValues(t, 50, l.MinEvidence)
			assert.Equal(t, 0.01, l.UnlikelyBelow)
			assert.Equal(t, 0.05, l.Explore)
		}},
		{name: "NoExplore", learned: retry.Learned{Explore: retry.NoExplore}, check: func(t *testing.T, l retry.Learned) {
			assert.Zero(t, l.Explore)
		}},
		{name: "negative evidence", learned: retry.Learned{MinEvidence: -1}, want: "MinEvidence -1"},
		{name: "threshold 1", learned: retry.Learned{UnlikelyBelow: 1}, want: "UnlikelyBelow 1"},
		{name: "explore all", learned: retry.Learned{Explore: 1}, want: "Explore 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := newRetry(retry.Config{Delayer: &fakeDelayer{}, Learned: &tt.learned})
			if tt.want != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.want)
				return
			}
			require.NoError(t, err)
			tt.check(t, *r.Config().Learned)
			assert.NotNil(t, r.Stats(), "statistics made for the policy")
		})
	}
}

// The statistics add no allocation to the success path of a message that never failed.
func TestStats_SuccessPathAllocatesNothingMore(t *testing.T) {
	stats, err := retrystats.New(retrystats.Config{})
	require.NoError(t, err)
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	allocs := func(cfg retry.Config) float64 {
		cfg.Delayer = &fakeDelayer{}
		cfg.Observer = disposition.ObserverFunc(func(context.Context, disposition.Outcome) {})
		r, err := newRetry(cfg)
		require.NoError(t, err)
		step := r.Middleware(ok)
		msg := message.NewMessage("m-1", []byte("x"))
		return testing.AllocsPerRun(1000, func() { _, _ = step(msg) })
	}
	without := allocs(retry.Config{})
	with := allocs(retry.Config{Stats: stats, Learned: &retry.Learned{}})
	assert.Equal(t, without, with)
	assert.Empty(t, stats.Snapshot())
}
