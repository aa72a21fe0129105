package router_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/router"
)

// The batch scenario: message i fails once (retryable) when i%10 == 0, fails permanently
// when i%50 == 1, and message 7 panics on every attempt; a duplicate (same idempotency
// key) of every i%20 == 5 is published too.
const (
	batchScenarioMessages = 1000
	batchScenarioPanicID  = 7
	batchScenarioRetries  = 2
)

var errScenarioTransient = errors.New("bulk write: deadlock detected")

// scenarioOutcome decides message i's outcome on the given attempt (retry count).
// panics reports a panic instead.
func scenarioOutcome(i, retryCount int) (err error, panics bool) {
	switch {
	case i == batchScenarioPanicID:
		return nil, true
	case i%50 == 1:
		return sluice.Permanent(fmt.Errorf("bulk write: row %d violates a constraint", i)), false
	case i%10 == 0 && retryCount == 0:
		return errScenarioTransient, false
	}
	return nil, false
}

// scenarioLedger is what the handler did, whichever shape it has.
type scenarioLedger struct {
	mu        sync.Mutex
	committed map[int]int          // id -> successes committed
	attempts  map[int]map[int]bool // id -> retry counts seen
	batches   []int                // sizes of the batch calls
}

func newScenarioLedger() *scenarioLedger {
	return &scenarioLedger{committed: map[int]int{}, attempts: map[int]map[int]bool{}}
}

func (l *scenarioLedger) committedTotal() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.committed {
		n += c
	}
	return n
}

// process is the work on a set of messages, as a bulk write does it: every outcome is
// decided, then the successes are committed at once; a panic commits nothing.
func (l *scenarioLedger) process(msgs []*message.Message) []error {
	errs := make([]error, len(msgs))
	ids := make([]int, len(msgs))
	for k, m := range msgs {
		id, err := strconv.Atoi(string(m.Payload))
		if err != nil {
			panic(err)
		}
		ids[k] = id
		rc := sluice.RetryCount(m.Metadata)
		l.mu.Lock()
		if l.attempts[id] == nil {
			l.attempts[id] = map[int]bool{}
		}
		l.attempts[id][rc] = true
		l.mu.Unlock()
		var panics bool
		errs[k], panics = scenarioOutcome(id, rc)
		if panics {
			panic(fmt.Sprintf("nil map in row %d", id))
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, id := range ids {
		if errs[k] == nil {
			l.committed[id]++
		}
	}
	return errs
}

// TestHandleBatch_EveryMessageEndsWhereASingleHandlerPutsIt runs the scenario on RabbitMQ
// with a single-message handler and with a batch handler (batches of 50): in both, every
// message is committed once or dead-lettered with its class, after the same number of
// attempts, and duplicates are not processed again.
func TestHandleBatch_EveryMessageEndsWhereASingleHandlerPutsIt(t *testing.T) {
	url := testenv.AMQPURL(t)
	for _, tc := range []struct {
		name  string
		batch bool
	}{
		{name: "single", batch: false},
		{name: "batch", batch: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ledger, dead := runBatchScenario(t, url, tc.batch)

			wantDead := map[int]string{batchScenarioPanicID: sluice.ClassRetryable.String()}
			for i := range batchScenarioMessages {
				if i%50 == 1 {
					wantDead[i] = sluice.ClassPermanent.String()
				}
			}
			assert.Equal(t, wantDead, dead, "dead letters (id -> x-error-class)")

			ledger.mu.Lock()
			defer ledger.mu.Unlock()
			for i := range batchScenarioMessages {
				wantCommits, wantAttempts := 1, 1
				switch {
				case i == batchScenarioPanicID:
					wantCommits, wantAttempts = 0, batchScenarioRetries+1
				case i%50 == 1:
					wantCommits = 0
				case i%10 == 0:
					wantAttempts = 2
				}
				assert.Equal(t, wantCommits, ledger.committed[i], "commits of message %d", i)
				assert.Len(t, ledger.attempts[i], wantAttempts, "attempts of message %d", i)
			}
			if tc.batch {
				require.NotEmpty(t, ledger.batches)
				assert.LessOrEqual(t, maxOf(ledger.batches), 50, "batch sizes %v", ledger.batches)
				assert.Equal(t, 50, maxOf(ledger.batches), "no full batch of 50 in %v", ledger.batches)
			}
		})
	}
}

// runBatchScenario publishes the scenario to a fresh queue, consumes it with a single or a
// batch handler until every message is settled and returns the ledger and the dead
// letters (id -> x-error-class).
func runBatchScenario(t *testing.T, url string, batch bool) (*scenarioLedger, map[int]string) {
	t.Helper()
	r := testenv.NewRabbit(t)
	q := testenv.Name("test.batch")
	r.DeleteQueues(q, topology.DLQ(q))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	br, err := amqp.New(ctx, amqp.Config{URLs: []string{url}, Logger: silentLogger})
	require.NoError(t, err)
	t.Cleanup(func() { _ = br.Close() })

	guard, err := idempotency.New(idempotency.Config{InFlightDeferral: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = guard.Close() })
	s, err := router.New(br, router.Config{Logger: silentLogger, Retry: fastRetries(batchScenarioRetries), Guard: guard})
	require.NoError(t, err)

	ledger := newScenarioLedger()
	if batch {
		err = s.HandleBatch("bulk", q, func(_ context.Context, msgs []*message.Message) []error {
			ledger.mu.Lock()
			ledger.batches = append(ledger.batches, len(msgs))
			ledger.mu.Unlock()
			return ledger.process(msgs)
		}, router.WithBatch(50, 200*time.Millisecond))
	} else {
		err = s.Handle("single", q, func(m *message.Message) error {
			return ledger.process([]*message.Message{m})[0]
		}, router.WithConcurrency(50))
	}
	require.NoError(t, err)
	require.NoError(t, s.Declare(ctx))

	var msgs []*message.Message
	for i := range batchScenarioMessages {
		m := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
		m.Metadata.Set(sluice.HeaderIdempotencyKey, "payment-"+strconv.Itoa(i))
		msgs = append(msgs, m)
		if i%20 == 5 {
			dup := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
			dup.Metadata.Set(sluice.HeaderIdempotencyKey, "payment-"+strconv.Itoa(i))
			msgs = append(msgs, dup)
		}
	}
	for start := 0; start < len(msgs); start += 100 {
		require.NoError(t, br.Publisher().Publish(q, msgs[start:min(start+100, len(msgs))]...))
	}

	serve(t, s)
	wantCommitted := batchScenarioMessages - batchScenarioMessages/50 - 1
	require.Eventually(t, func() bool {
		return ledger.committedTotal() == wantCommitted && r.Count(topology.DLQ(q)) == batchScenarioMessages/50+1
	}, 60*time.Second, 50*time.Millisecond, "committed %d of %d", ledger.committedTotal(), wantCommitted)
	// Deferred duplicates come back after the test's goal is met: they must not commit.
	assert.Never(t, func() bool { return ledger.committedTotal() != wantCommitted }, time.Second, 50*time.Millisecond)

	dead := map[int]string{}
	for {
		d, ok := r.Get(topology.DLQ(q))
		if !ok {
			break
		}
		id, err := strconv.Atoi(string(d.Body))
		require.NoError(t, err)
		class, _ := d.Headers[headers.ErrorClass].(string)
		dead[id] = class
	}
	return ledger, dead
}

func maxOf(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
