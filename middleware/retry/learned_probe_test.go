package retry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/sluice-go/sluice/middleware/retry"
)

// probeWorld runs the retry step with the learned policy in a Watermill router over
// gochannel, as newLoop does, but its delay holds every retry copy until the test
// delivers it (here, or to another world: another instance), on a clock the test moves.
// Its handler fails with "upstream" until fixed, then succeeds from attempt 2.
type probeWorld struct {
	t     *testing.T
	pub   *gochannel.GoChannel
	r     *retry.Retry
	clock atomic.Int64
	fixed atomic.Bool

	mu     sync.Mutex
	held   map[string]*message.Message // message id -> its retry copy, not delivered yet
	dead   map[string]*message.Message // message id -> the message as dead-lettered
	reason map[string]error
	ok     map[string]bool
	calls  map[string]int
	seen   map[string]int // message id -> attempts whose outcome was observed
}

const probeExplore = 0.05

func newProbeWorld(t *testing.T, learned retry.Learned) *probeWorld {
	t.Helper()
	w := &probeWorld{t: t, held: map[string]*message.Message{}, dead: map[string]*message.Message{},
		reason: map[string]error{}, ok: map[string]bool{}, calls: map[string]int{}, seen: map[string]int{}}
	w.clock.Store(now.UnixNano())
	logger := watermill.NopLogger{}
	w.pub = gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, logger)
	var err error
	w.r, err = retry.New(retry.Config{
		Delayer: probeDelayer{w}, DeadLetterer: probeDead{w}, Logger: slog.New(slog.DiscardHandler), Jitter: retry.NoJitter,
		MaxRetries: 2, InitialDelay: 100 * time.Millisecond, MaxDelay: time.Second, Learned: &learned,
		Now: func() time.Time { return time.Unix(0, w.clock.Load()) },
		// Told last, after the policy saw the outcome: the attempt has ended.
		Observer: disposition.ObserverFunc(func(_ context.Context, o disposition.Outcome) {
			w.mu.Lock()
			defer w.mu.Unlock()
			if o.Disposition.Kind == disposition.DeadLetter {
				w.reason[o.MessageID] = o.Disposition.Reason
			}
			w.seen[o.MessageID]++
		}),
	})
	require.NoError(t, err)
	serve(t, w.pub, w.r, w.handle)
	return w
}

type probeDelayer struct{ w *probeWorld }

func (d probeDelayer) Delay(_ context.Context, _ string, _ time.Duration, msg *message.Message) error {
	d.w.mu.Lock()
	defer d.w.mu.Unlock()
	d.w.held[msg.UUID] = msg
	return nil
}

type probeDead struct{ w *probeWorld }

func (d probeDead) DeadLetter(_ context.Context, _ string, msg *message.Message) error {
	d.w.mu.Lock()
	defer d.w.mu.Unlock()
	d.w.dead[msg.UUID] = msg
	return nil
}

func (w *probeWorld) handle(msg *message.Message) ([]*message.Message, error) {
	w.mu.Lock()
	w.calls[msg.UUID]++
	w.mu.Unlock()
	if !w.fixed.Load() || sluice.RetryCount(msg.Metadata) == 0 {
		return nil, typed("upstream")
	}
	w.mu.Lock()
	w.ok[msg.UUID] = true
	w.mu.Unlock()
	return nil, nil
}

// deliver publishes msg and waits until this attempt ended: held for a retry, dead-lettered
// or succeeded. It returns what became of it: "retry", "unlikely", "exhausted" or "ok".
func (w *probeWorld) deliver(msg *message.Message) string {
	w.t.Helper()
	w.mu.Lock()
	before := w.seen[msg.UUID]
	delete(w.held, msg.UUID)
	w.mu.Unlock()
	require.NoError(w.t, w.pub.Publish(queueName, msg))
	var out string
	require.Eventually(w.t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		switch {
		case w.seen[msg.UUID] == before:
			return false
		case w.held[msg.UUID] != nil:
			out = "retry"
		case w.reason[msg.UUID] != nil && errors.Is(w.reason[msg.UUID], disposition.ErrRetryUnlikely):
			out = "unlikely"
		case w.reason[msg.UUID] != nil:
			out = "exhausted"
		case w.ok[msg.UUID]:
			out = "ok"
		default:
			return false
		}
		return true
	}, 10*time.Second, time.Millisecond)
	return out
}

// send delivers a fresh message with id.
func (w *probeWorld) send(id string) string {
	w.t.Helper()
	return w.deliver(message.NewMessage(id, []byte("upstream")))
}

// release delivers id's held retry copy here.
func (w *probeWorld) release(id string) string {
	w.t.Helper()
	return w.deliver(w.copyOf(id))
}

func (w *probeWorld) copyOf(id string) *message.Message {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	cp := w.held[id]
	require.NotNil(w.t, cp, "a retry copy of %s is held", id)
	return cp
}

// stop gives the policy its evidence: n messages exhausted by the base policy (2 retries).
func (w *probeWorld) stop(ids *ids, n int) {
	w.t.Helper()
	for range n {
		id := ids.next()
		require.Equal(w.t, "retry", w.send(id))
		require.Equal(w.t, "retry", w.release(id))
		require.Equal(w.t, "exhausted", w.release(id))
	}
	require.True(w.t, w.r.LearnedView(handlerName, "upstream").Stopped)
}

func (w *probeWorld) advance(d time.Duration) { w.clock.Add(int64(d)) }

func (w *probeWorld) probe() string {
	return w.r.LearnedView(handlerName, "upstream").Probe
}

// ids hands out message ids outside the hashed explored share, or inside it.
type ids struct {
	n      int
	hashed bool
}

func (g *ids) next() string {
	for {
		g.n++
		id := fmt.Sprintf("msg-%d-%t", g.n, g.hashed)
		if retry.Explored(id, probeExplore) == g.hashed {
			return id
		}
	}
}

// While a type is stopped, one message is always in its retry path: the first message
// after the stop becomes the probe and follows the base policy on every attempt (its copies
// marked), the messages arriving meanwhile are dead-lettered at once, the next message
// after its end is the next probe, and a fix shows at the probe's next attempt. Without the
// probe, every one of these messages (outside the hashed share) is dead-lettered at once.
func TestLearned_ProbeAlwaysInFlight(t *testing.T) {
	w := newProbeWorld(t, retry.Learned{MinEvidence: 5, Explore: probeExplore})
	g := &ids{}
	w.stop(g, 5)
	require.Empty(t, w.probe(), "no probe before a message of the type fails again")

	a := g.next()
	require.Equal(t, "retry", w.send(a), "the first message after the stop is the probe")
	assert.Equal(t, "upstream", w.copyOf(a).Metadata.Get(retry.HeaderProbe), "its retry copy is marked")
	assert.Equal(t, a, w.probe())
	for range 3 {
		assert.Equal(t, "unlikely", w.send(g.next()), "dead-lettered at once while the probe is in flight")
	}
	assert.Equal(t, "retry", w.release(a), "the probe follows the base policy on its next attempt")
	assert.Equal(t, "upstream", w.copyOf(a).Metadata.Get(retry.HeaderProbe))
	assert.Equal(t, "unlikely", w.send(g.next()))
	assert.Equal(t, "exhausted", w.release(a), "and ends as the base policy says")
	assert.Empty(t, w.probe(), "its end frees the lease (after a rest as long as its flight: none on this clock)")

	b := g.next()
	require.Equal(t, "retry", w.send(b), "the next message is the next probe")
	assert.Equal(t, b, w.probe())
	assert.Equal(t, "unlikely", w.send(g.next()))

	w.fixed.Store(true)
	assert.Equal(t, "ok", w.release(b), "the fix shows at the probe's next attempt")
	v := w.r.LearnedView(handlerName, "upstream")
	assert.False(t, v.Stopped, v.Reason)
	assert.EqualValues(t, 1, v.Recovered)
	assert.Equal(t, "retry", w.send(g.next()), "retried again")
}

// A message of the hashed share in its retry path holds the lease: no probe is added
// while it is, and one is as soon as it ended.
func TestLearned_HashedShareHoldsTheLease(t *testing.T) {
	w := newProbeWorld(t, retry.Learned{MinEvidence: 5, Explore: probeExplore})
	g, hashed := &ids{}, &ids{hashed: true}
	w.stop(g, 5)
	h := hashed.next()
	require.Equal(t, "retry", w.send(h))
	assert.Empty(t, w.copyOf(h).Metadata.Get(retry.HeaderProbe), "explored by its id: no mark needed")
	assert.Equal(t, h, w.probe())
	assert.Equal(t, "unlikely", w.send(g.next()), "no probe while an explored message is in flight")
	require.Equal(t, "retry", w.release(h))
	require.Equal(t, "exhausted", w.release(h))
	assert.Equal(t, "retry", w.send(g.next()), "a probe once it ended")
}

// The lease is a time, not a timer: a probe whose next attempt never comes back here (it
// went to another instance, or was lost) holds it for twice its retry delay plus a second,
// then the next message becomes a probe.
func TestLearned_ProbeLeaseLapses(t *testing.T) {
	tests := []struct {
		name    string
		advance time.Duration
		want    string
	}{
		// The first retry waits 100 ms: the lease lasts 2×100 ms + 1 s.
		{name: "within the lease", advance: 1199 * time.Millisecond, want: "unlikely"},
		{name: "lapsed", advance: 1200 * time.Millisecond, want: "retry"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newProbeWorld(t, retry.Learned{MinEvidence: 5, Explore: probeExplore})
			g := &ids{}
			w.stop(g, 5)
			require.Equal(t, "retry", w.send(g.next()))
			w.advance(tt.advance)
			assert.Equal(t, tt.want, w.send(g.next()))
		})
	}
}

// A probe's later attempts may reach another instance: its mark makes that instance explore
// it too (and take its lease there). A mark is sluice's only on a message whose trip
// headers are sluice's own retry state; any other is removed and counts for nothing.
func TestLearned_ProbeMarkAcrossInstancesAndForged(t *testing.T) {
	tests := []struct {
		name string
		md   message.Metadata
		want string
	}{
		{name: "fresh from a producer", md: message.Metadata{retry.HeaderProbe: "upstream"}, want: "unlikely"},
		{name: "forged retry count without trip headers", md: message.Metadata{
			retry.HeaderProbe: "upstream", sluice.HeaderRetryCount: "1"}, want: "unlikely"},
		{name: "trip headers that disagree", md: message.Metadata{
			retry.HeaderProbe: "upstream", sluice.HeaderRetryCount: "3", "x-trip-attempts": "1"}, want: "unlikely"},
		{name: "a replay copy", md: message.Metadata{retry.HeaderProbe: "upstream", "x-replayed-at": now.Format(time.RFC3339Nano)}, want: "unlikely"},
		// Documented: consistent forged state buys the base policy, as an id in the hashed share does.
		{name: "consistent forged retry state", md: message.Metadata{
			retry.HeaderProbe: "upstream", sluice.HeaderRetryCount: "1", "x-trip-attempts": "1"}, want: "retry"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newProbeWorld(t, retry.Learned{MinEvidence: 5, Explore: probeExplore})
			g := &ids{}
			w.stop(g, 5)
			require.Equal(t, "retry", w.send(g.next()), "a probe holds the lease")
			id := g.next()
			msg := message.NewMessage(id, []byte("upstream"))
			for k, v := range tt.md {
				msg.Metadata.Set(k, v)
			}
			assert.Equal(t, tt.want, w.deliver(msg))
			if tt.want == "unlikely" {
				w.mu.Lock()
				rec := w.dead[id]
				w.mu.Unlock()
				require.NotNil(t, rec)
				assert.Empty(t, rec.Metadata.Get(retry.HeaderProbe), "a producer's mark is removed")
			}
		})
	}

	t.Run("sluice's mark from another instance", func(t *testing.T) {
		one := newProbeWorld(t, retry.Learned{MinEvidence: 5, Explore: probeExplore})
		two := newProbeWorld(t, retry.Learned{MinEvidence: 5, Explore: probeExplore})
		g := &ids{}
		one.stop(g, 5)
		two.stop(g, 5)
		require.Equal(t, "retry", two.send(g.next()), "instance two has a probe of its own")

		p := g.next()
		require.Equal(t, "retry", one.send(p), "instance one's probe")
		cp := one.copyOf(p)
		assert.Equal(t, "retry", two.deliver(cp), "explored on instance two, though its lease is held")
		assert.Equal(t, "upstream", two.copyOf(p).Metadata.Get(retry.HeaderProbe), "and still marked")
		assert.Equal(t, "exhausted", two.release(p))
	})
}

// With NoExplore there is no probe either: a stopped type's messages are all dead-lettered.
func TestLearned_NoExploreNoProbe(t *testing.T) {
	w := newProbeWorld(t, retry.Learned{MinEvidence: 5, Explore: retry.NoExplore})
	g := &ids{}
	w.stop(g, 5)
	for range 3 {
		assert.Equal(t, "unlikely", w.send(g.next()))
	}
	assert.Empty(t, w.probe())
}

// A probe that ends without recovering is followed by a rest as long as it was in flight,
// so that a probe is in flight at most half the time a type is stopped; a probe that
// recovers frees the lease at once.
func TestLearned_ProbeRestsAfterAFailedProbe(t *testing.T) {
	tests := []struct {
		name    string
		fixed   bool // the probe recovers at its next attempt
		advance time.Duration
		want    string
	}{
		// The probe was in flight 300 ms (two attempts, 150 ms apart).
		{name: "during the rest", advance: 299 * time.Millisecond, want: "unlikely"},
		{name: "after the rest", advance: 300 * time.Millisecond, want: "retry"},
		{name: "recovered: no rest", fixed: true, want: "retry"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Stopped below 50% recovered: one recovery of 6 ended keeps it stopped.
			w := newProbeWorld(t, retry.Learned{MinEvidence: 5, Explore: probeExplore, UnlikelyBelow: 0.5})
			g := &ids{}
			w.stop(g, 5)
			a := g.next()
			require.Equal(t, "retry", w.send(a))
			w.advance(150 * time.Millisecond)
			if tt.fixed {
				w.fixed.Store(true)
				require.Equal(t, "ok", w.release(a))
				v := w.r.LearnedView(handlerName, "upstream")
				require.True(t, v.Stopped, v.Reason)
				assert.Empty(t, v.Probe, "no probe in flight")
				assert.True(t, v.NextProbe.IsZero(), "and no rest")
				assert.Equal(t, tt.want, w.send(g.next()), "the next message is a probe at once")
				return
			}
			require.Equal(t, "retry", w.release(a))
			w.advance(150 * time.Millisecond)
			require.Equal(t, "exhausted", w.release(a))
			v := w.r.LearnedView(handlerName, "upstream")
			assert.Empty(t, v.Probe)
			assert.WithinDuration(t, now.Add(600*time.Millisecond), v.NextProbe, 0, "the last probe did not recover: the next starts 300 ms later")
			w.advance(tt.advance)
			assert.Equal(t, tt.want, w.send(g.next()))
		})
	}
}
