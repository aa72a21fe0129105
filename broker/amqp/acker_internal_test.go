package amqp

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeChannel plays RabbitMQ's side of basic.ack on one channel: it fails the test the
// way the broker closes a channel, for an ack of a tag that is not outstanding, and it
// records a multiple ack that would cover a delivery still with its handler (which a real
// broker would silently take, losing that message on a crash).
type fakeChannel struct {
	mu          sync.Mutex
	outstanding map[uint64]bool // tag -> its handler acked it
	frames      int
	errs        []string
}

func newFakeChannel(n int) *fakeChannel {
	f := &fakeChannel{outstanding: make(map[uint64]bool, n)}
	for t := 1; t <= n; t++ {
		f.outstanding[uint64(t)] = false
	}
	return f
}

func (f *fakeChannel) handled(tag uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.outstanding[tag] = true
}

func (f *fakeChannel) nack(tag uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.outstanding, tag)
}

func (f *fakeChannel) Ack(tag uint64, multiple bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.frames++
	if _, ok := f.outstanding[tag]; !ok {
		f.errs = append(f.errs, fmt.Sprintf("PRECONDITION_FAILED - unknown delivery tag %d", tag))
		return nil
	}
	if !multiple {
		delete(f.outstanding, tag)
		return nil
	}
	for t, ok := range f.outstanding {
		if t > tag {
			continue
		}
		if !ok {
			f.errs = append(f.errs, fmt.Sprintf("multiple ack %d covers tag %d, still with its handler", tag, t))
		}
		delete(f.outstanding, t)
	}
	return nil
}

func TestAckerNeverAcksAnUnsettledTag(t *testing.T) {
	for _, tc := range []struct {
		name     string
		batch    int
		delay    time.Duration
		nackEach int // every nackEach-th tag is nacked; 0 none
		workers  int
		// fewFrames: acks must share frames. Only asserted where handlers finish in
		// order: out of order, how many share depends on the scheduler.
		fewFrames bool
	}{
		{name: "one at a time", batch: 1, delay: -1, workers: 4},
		{name: "batched in order", batch: 16, delay: 50 * time.Millisecond, workers: 1, fewFrames: true},
		{name: "batched out of order", batch: 16, delay: time.Millisecond, workers: 8},
		{name: "batched with nacks", batch: 8, delay: 200 * time.Microsecond, nackEach: 7, workers: 8},
		{name: "all nacked", batch: 8, delay: time.Millisecond, nackEach: 1, workers: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 5000
			ch := newFakeChannel(n)
			a := newAcker(ch, tc.batch, tc.delay, slog.New(slog.DiscardHandler), "q")

			// Deliveries are handed out in tag order, and handlers finish in any order.
			tags := make(chan uint64)
			var wg sync.WaitGroup
			for range tc.workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for tag := range tags {
						if rand.N(4) == 0 {
							time.Sleep(time.Duration(rand.N(50)) * time.Microsecond)
						}
						if tc.nackEach > 0 && tag%uint64(tc.nackEach) == 0 {
							ch.nack(tag) // the subscriber sends its nack itself
							a.nacked(tag)
							continue
						}
						ch.handled(tag)
						a.ack(tag)
					}
				}()
			}
			for tag := uint64(1); tag <= n; tag++ {
				tags <- tag
			}
			close(tags)
			wg.Wait()
			a.close()

			ch.mu.Lock()
			defer ch.mu.Unlock()
			assert.Empty(t, ch.errs)
			assert.Empty(t, ch.outstanding, "every delivery must be acked or nacked")
			if tc.fewFrames {
				assert.LessOrEqual(t, ch.frames, n/4, "acks close together must share frames")
			}
		})
	}
}

func TestAckerSendsAcksAboveASlowDeliveryAtOnce(t *testing.T) {
	ch := newFakeChannel(3)
	a := newAcker(ch, 100, time.Millisecond, slog.New(slog.DiscardHandler), "q")
	defer a.close()

	// Tag 1 stays with its handler; 2 and 3 must not wait for it.
	ch.handled(2)
	a.ack(2)
	ch.handled(3)
	a.ack(3)
	require.Eventually(t, func() bool {
		ch.mu.Lock()
		defer ch.mu.Unlock()
		_, has2 := ch.outstanding[2]
		_, has3 := ch.outstanding[3]
		return !has2 && !has3
	}, 5*time.Second, time.Millisecond)

	ch.handled(1)
	a.ack(1)
	require.Eventually(t, func() bool {
		ch.mu.Lock()
		defer ch.mu.Unlock()
		return len(ch.outstanding) == 0
	}, 5*time.Second, time.Millisecond)
	ch.mu.Lock()
	defer ch.mu.Unlock()
	assert.Empty(t, ch.errs)
}

// TestAcker_GatesRunInOrderOneAtATime checks the held acks' waits of one channel: they
// run in the order they came, one at a time, and a wait still blocked when the acker
// closes is ended by its grace, after which no gate goroutine is left.
func TestAcker_GatesRunInOrderOneAtATime(t *testing.T) {
	t.Run("in order, one at a time", func(t *testing.T) {
		a := newAcker(newFakeChannel(0), 1, 0, slog.New(slog.DiscardHandler), "q")
		a.gateGrace = time.Minute
		const n = 50
		release := make([]chan struct{}, n)
		var mu sync.Mutex
		var settled []int
		running, most := 0, 0
		for i := range n {
			release[i] = make(chan struct{})
			a.gate(func(<-chan struct{}) error {
				mu.Lock()
				running++
				most = max(most, running)
				mu.Unlock()
				<-release[i]
				mu.Lock()
				running--
				mu.Unlock()
				return nil
			}, func(error) {
				mu.Lock()
				settled = append(settled, i)
				mu.Unlock()
			})
		}
		// Released last to first: a wait that ran ahead of its turn would settle early.
		for i := n - 1; i >= 0; i-- {
			close(release[i])
		}
		a.close()
		want := make([]int, n)
		for i := range want {
			want[i] = i
		}
		assert.Equal(t, want, settled)
		assert.Equal(t, 1, most, "waits running at once")
	})
	t.Run("a blocked wait ends at the close's grace", func(t *testing.T) {
		a := newAcker(newFakeChannel(0), 1, 0, slog.New(slog.DiscardHandler), "q")
		a.gateGrace = 20 * time.Millisecond
		var got []error
		errStopped := fmt.Errorf("stopped")
		for range 2 {
			a.gate(func(stop <-chan struct{}) error {
				<-stop
				return errStopped
			}, func(err error) { got = append(got, err) })
		}
		a.close()
		assert.Equal(t, []error{errStopped, errStopped}, got)
		a.gateMu.Lock()
		defer a.gateMu.Unlock()
		assert.False(t, a.gating, "a gate goroutine outlived close")
		assert.Empty(t, a.gates)
	})
}
