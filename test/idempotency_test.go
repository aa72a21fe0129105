package test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// TestIdempotencyThroughTheStack publishes 1,000 payment requests, 30% of them duplicates
// (the same payment_id under a new message id), to a handler running 8 at a time; some
// payments fail their first attempt and are retried broker-side. Every payment must be
// charged exactly once, every duplicate acknowledged without a charge, nothing left in
// the queue or the DLQ.
func TestIdempotencyThroughTheStack(t *testing.T) {
	const (
		total      = 1000
		duplicates = 300
		payments   = total - duplicates
	)
	onEachBroker(t, func(t *testing.T, e *env) {
		queue := e.newQueue(t, "test.idempotency")
		guard, err := idempotency.New(idempotency.Config{InFlightDeferral: 100 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, guard.Close()) })

		var (
			mu       sync.Mutex
			charges  = map[string]int{}
			attempts = map[string]int{}
			calls    atomic.Int64
		)
		paymentID := func(msg *message.Message) (string, error) {
			var p struct {
				PaymentID string `json:"payment_id"`
			}
			if err := json.Unmarshal(msg.Payload, &p); err != nil || p.PaymentID == "" {
				return "", fmt.Errorf("no payment_id in %q: %v", msg.Payload, err)
			}
			return p.PaymentID, nil
		}
		start(t, e, router.Config{
			Guard: guard,
			Retry: retry.Config{MaxRetries: 5, InitialDelay: 50 * time.Millisecond, Jitter: retry.NoJitter},
		}, func(s *router.Stack) {
			require.NoError(t, s.Handle("charge", queue, func(msg *message.Message) error {
				calls.Add(1)
				id, err := paymentID(msg)
				if err != nil {
					return sluice.Permanent(err)
				}
				time.Sleep(2 * time.Millisecond) // the gateway call: lets duplicates overlap
				mu.Lock()
				defer mu.Unlock()
				attempts[id]++
				var n int
				_, _ = fmt.Sscanf(id, "pay-%d", &n)
				if n%10 == 0 && attempts[id] == 1 {
					return errors.New("gateway timeout") // before the charge: retried
				}
				charges[id]++
				return nil
			}, router.WithConcurrency(8), router.WithIdempotencyKey(paymentID)))
		})

		// Each duplicate follows its original closely, so that many are consumed while the
		// original is in flight; half the messages also carry the key as metadata.
		rng := rand.New(rand.NewPCG(7, 11))
		msgs := make([]*message.Message, 0, total)
		for i := range payments {
			msgs = append(msgs, paymentRequest(fmt.Sprintf("m-%d", i), fmt.Sprintf("pay-%d", i), i%2 == 0))
		}
		for d := range duplicates {
			orig := rng.IntN(payments)
			at := min(len(msgs), orig+1+rng.IntN(4))
			dup := paymentRequest(fmt.Sprintf("dup-%d", d), fmt.Sprintf("pay-%d", orig), d%2 == 0)
			msgs = append(msgs[:at], append([]*message.Message{dup}, msgs[at:]...)...)
		}
		require.NoError(t, broker.QueuePublisher(e.broker).Publish(queue, msgs...))

		// settle also waits a little after: no late redelivery may charge twice.
		settle(t, func() bool {
			st := guard.Stats()
			return st.Completed == payments && st.Hits == duplicates
		}, "every payment completed, every duplicate acknowledged")

		mu.Lock()
		defer mu.Unlock()
		require.Len(t, charges, payments, "payments charged")
		for id, n := range charges {
			require.Equal(t, 1, n, "charges of %s", id)
		}
		st := guard.Stats()
		assert.Equal(t, uint64(payments), st.Completed)
		assert.Equal(t, uint64(duplicates), st.Hits)
		assert.Equal(t, uint64(payments/10), st.Released, "failed first attempts released their key")
		assert.Zero(t, st.KeyErrors)
		assert.Equal(t, 0, e.count(t, queue), "queue empty")
		assert.Equal(t, 0, e.count(t, topology.DLQ(queue)), "DLQ empty")
		t.Logf("%s: %d handler calls; in-flight duplicates deferred %d times; stats %+v",
			e.name, calls.Load(), st.InFlightHits, st)
	})
}

func paymentRequest(id, paymentID string, keyInMetadata bool) *message.Message {
	msg := message.NewMessage(id, fmt.Appendf(nil, `{"payment_id":%q,"amount_cents":1250}`, paymentID))
	if keyInMetadata {
		msg.Metadata.Set(sluice.HeaderIdempotencyKey, paymentID)
	}
	return msg
}
