package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/middleware/idempotency"
)

// memJournal is a journal in memory, shared by the Guards of one test as a stream is by
// instances; fail makes appends fail, delay slows their confirms. The real one
// (broker/amqp's stream journal) is tested against RabbitMQ in broker/amqp and test/.
type memJournal struct {
	mu      sync.Mutex
	records [][]byte
	changed chan struct{}
	appends atomic.Int64
	fail    atomic.Bool
	blocked atomic.Bool
	delay   time.Duration
}

func newMemJournal() *memJournal { return &memJournal{changed: make(chan struct{})} }

func (j *memJournal) Journal(string, time.Duration) broker.Journal { return j }

func (j *memJournal) Append(ctx context.Context, body []byte) error {
	if j.delay > 0 {
		time.Sleep(j.delay)
	}
	if j.fail.Load() {
		return errors.New("stream unavailable")
	}
	if j.blocked.Load() {
		return fmt.Errorf("append: %w: low on memory", broker.ErrBlocked)
	}
	j.appends.Add(1)
	j.put(body)
	return nil
}

func (j *memJournal) put(body []byte) {
	j.mu.Lock()
	j.records = append(j.records, append([]byte(nil), body...))
	close(j.changed)
	j.changed = make(chan struct{})
	j.mu.Unlock()
}

func (j *memJournal) Follow(ctx context.Context, _ time.Time, deliver func([]byte), caughtUp func()) error {
	j.mu.Lock()
	upTo := len(j.records)
	j.mu.Unlock()
	next := 0
	for {
		j.mu.Lock()
		recs, changed := j.records[next:], j.changed
		j.mu.Unlock()
		for _, r := range recs {
			deliver(r)
			next++
			if next == upTo {
				caughtUp()
			}
		}
		if upTo == 0 && next == 0 {
			upTo = -1
			caughtUp()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// journaledStep is g's step over h, restored from j, for handler "charge".
func journaledStep(t *testing.T, g *idempotency.Guard, j broker.Journaler, h message.HandlerFunc) message.HandlerFunc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mw, err := g.Journaled(ctx, j, "sluice.idempotency.q", nil)
	require.NoError(t, err)
	step := mw(h)
	return func(m *message.Message) ([]*message.Message, error) {
		return step(m)
	}
}

// A key done on one Guard is known to a Guard started later on the same journal (a
// restart after a crash: the first Guard is never closed) and to one already running (a
// second instance), and its duplicate is acknowledged without calling the handler.
func TestJournaled_RestartAndSecondInstanceKnowTheKey(t *testing.T) {
	j := newMemJournal()
	var calls atomic.Int64
	charge := func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, nil }

	crashed := newGuard(t, idempotency.Config{})
	other := newGuard(t, idempotency.Config{})
	a := journaledStep(t, crashed, j, charge)
	b := journaledStep(t, other, j, charge)
	for i := range 50 {
		_, err := a(newMessage(fmt.Sprintf("m-%d", i), fmt.Sprintf("pay-%d", i)))
		require.NoError(t, err)
	}
	require.EqualValues(t, 50, calls.Load())
	assert.EqualValues(t, 50, crashed.Stats().Journal.Appended, "each done key journaled before its ack")

	restarted := newGuard(t, idempotency.Config{})
	c := journaledStep(t, restarted, j, charge)
	assert.EqualValues(t, 50, restarted.Stats().Journal.Restored, "restored before the step was returned")
	require.Eventually(t, func() bool { return other.Stats().Journal.Applied >= 50 }, 5*time.Second, time.Millisecond)
	for i := range 50 {
		for _, step := range []message.HandlerFunc{b, c} {
			_, err := step(newMessage(fmt.Sprintf("dup-%d", i), fmt.Sprintf("pay-%d", i)))
			require.NoError(t, err, "a duplicate is acknowledged")
		}
	}
	assert.EqualValues(t, 50, calls.Load(), "no duplicate charged, on the restarted Guard nor on the other instance")
	assert.EqualValues(t, 50, restarted.Stats().Hits)
	assert.EqualValues(t, 50, other.Stats().Hits)
}

// While the journal refuses appends, a message whose work is done is not acknowledged: it
// is deferred (so redelivered later), its key stays done here so the redelivery does not
// run the handler again, and once the journal takes appends again the redelivery is
// journaled and acknowledged.
func TestJournaled_UnconfirmedRecordDefersTheMessage(t *testing.T) {
	j := newMemJournal()
	g := newGuard(t, idempotency.Config{})
	var calls atomic.Int64
	step := journaledStep(t, g, j, func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, nil })

	j.fail.Store(true)
	_, err := step(newMessage("m-1", "pay-1"))
	var d *markers.Defer
	require.ErrorAs(t, err, &d, "not acknowledged while its record is not confirmed")
	assert.ErrorIs(t, err, idempotency.ErrJournal)
	assert.Equal(t, 1, g.Stats().Journal.Unconfirmed)

	_, err = step(newMessage("m-1", "pay-1"))
	require.ErrorAs(t, err, &d, "the redelivery is deferred again while the journal still refuses")
	assert.EqualValues(t, 1, calls.Load(), "the handler is not run again")

	j.fail.Store(false)
	_, err = step(newMessage("m-1", "pay-1"))
	require.NoError(t, err, "journaled now, so acknowledged")
	assert.EqualValues(t, 1, calls.Load())
	st := g.Stats().Journal
	assert.Zero(t, st.Unconfirmed)
	assert.EqualValues(t, 1, st.Appended)
	assert.GreaterOrEqual(t, st.Failures, int64(2))
}

// Under a resource alarm (the broker blocks publishing) the step acknowledges anyway, so
// RabbitMQ's queues drain, and keeps the key done here; the record is appended once the
// alarm clears, so a Guard started after that knows the key.
func TestJournaled_BlockedAcksAndJournalsAfterTheAlarm(t *testing.T) {
	j := newMemJournal()
	g := newGuard(t, idempotency.Config{})
	var calls atomic.Int64
	charge := func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, nil }
	step := journaledStep(t, g, j, charge)

	j.blocked.Store(true)
	_, err := step(newMessage("m-1", "pay-1"))
	require.NoError(t, err, "acknowledged under the alarm")
	_, err = step(newMessage("m-2", "pay-1"))
	require.NoError(t, err, "its duplicate too, without a charge")
	assert.EqualValues(t, 1, calls.Load())
	st := g.Stats().Journal
	assert.EqualValues(t, 1, st.BlockedAcks)
	assert.Equal(t, 1, st.Unconfirmed)

	j.blocked.Store(false)
	require.Eventually(t, func() bool { return g.Stats().Journal.Unconfirmed == 0 }, 10*time.Second, 10*time.Millisecond,
		"journaled once the alarm cleared")
	later := newGuard(t, idempotency.Config{})
	_, err = journaledStep(t, later, j, charge)(newMessage("m-3", "pay-1"))
	require.NoError(t, err)
	assert.EqualValues(t, 1, calls.Load(), "a Guard started after the alarm knows the key")
}

// Attempts finishing together share journal messages (group commit): 64 concurrent keys
// with a 20 ms confirm take far fewer than 64 appends.
func TestJournaled_GroupCommit(t *testing.T) {
	j := newMemJournal()
	j.delay = 20 * time.Millisecond
	g := newGuard(t, idempotency.Config{})
	step := journaledStep(t, g, j, func(*message.Message) ([]*message.Message, error) { return nil, nil })
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := step(newMessage(fmt.Sprintf("m-%d", i), fmt.Sprintf("pay-%d", i)))
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	st := g.Stats().Journal
	assert.EqualValues(t, 64, st.Appended)
	assert.Less(t, st.Batches, int64(16), "64 records in %d journal messages", st.Batches)
	t.Logf("64 concurrent records in %d journal messages", st.Batches)
}

// A journal message that is not a record batch (corrupt, foreign, truncated) is skipped and
// counted, never a crash, and the records around it are restored.
func TestJournaled_ForeignRecordsAreSkipped(t *testing.T) {
	j := newMemJournal()
	g := newGuard(t, idempotency.Config{})
	step := journaledStep(t, g, j, func(*message.Message) ([]*message.Message, error) { return nil, nil })
	_, err := step(newMessage("m-1", "pay-1"))
	require.NoError(t, err)
	good := j.records[0]
	flipped := append([]byte(nil), good...)
	flipped[10] ^= 0xff
	for _, bad := range [][]byte{nil, []byte("hello"), []byte(`{"payment_id":"x"}`), good[:len(good)-1], flipped} {
		j.put(bad)
	}
	_, err = step(newMessage("m-2", "pay-2"))
	require.NoError(t, err)

	restarted := newGuard(t, idempotency.Config{})
	var calls atomic.Int64
	again := journaledStep(t, restarted, j, func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, nil })
	for _, k := range []string{"pay-1", "pay-2"} {
		_, err := again(newMessage("dup-"+k, k))
		require.NoError(t, err)
	}
	assert.Zero(t, calls.Load(), "both keys restored around the foreign records")
	assert.EqualValues(t, 5, restarted.Stats().Journal.Skipped)
}

// A journal holding more keys than MaxKeys restores the newest: they are read last and
// evict the oldest.
func TestJournaled_NewestKeysWinOverMaxKeys(t *testing.T) {
	j := newMemJournal()
	g := newGuard(t, idempotency.Config{})
	step := journaledStep(t, g, j, func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for i := range 200 {
		_, err := step(newMessage(fmt.Sprintf("m-%d", i), fmt.Sprintf("pay-%d", i)))
		require.NoError(t, err)
	}
	small := newGuard(t, idempotency.Config{MaxKeys: 50})
	var ran []int
	again := journaledStep(t, small, j, func(m *message.Message) ([]*message.Message, error) {
		var n int
		_, _ = fmt.Sscanf(m.Metadata.Get(sluice.HeaderIdempotencyKey), "pay-%d", &n)
		ran = append(ran, n)
		return nil, errors.New("probe: release the key")
	})
	for _, i := range []int{199, 190, 160, 0, 10} {
		_, _ = again(newMessage(fmt.Sprintf("p-%d", i), fmt.Sprintf("pay-%d", i)))
	}
	assert.Equal(t, []int{0, 10}, ran, "the newest keys are known, the oldest forgotten")
}

// With DisableJournal, Journaled is NewMiddleware: nothing is appended or read.
func TestJournaled_Disabled(t *testing.T) {
	j := newMemJournal()
	g := newGuard(t, idempotency.Config{DisableJournal: true})
	step := journaledStep(t, g, j, func(*message.Message) ([]*message.Message, error) { return nil, nil })
	_, err := step(newMessage("m-1", "pay-1"))
	require.NoError(t, err)
	assert.Zero(t, j.appends.Load())
	assert.Zero(t, g.Stats().Journal)
}
