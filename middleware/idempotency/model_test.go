package idempotency_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/middleware/idempotency"
)

// modelKey is what a key's state should be, by the rules the store documents.
type modelKey struct {
	done   bool
	until  time.Time
	holder int // id of the in-flight holder
}

type heldLease struct {
	key   string
	id    int
	lease idempotency.Lease
}

// TestStore_AgreesWithModel drives the store with random begins, completes, releases,
// clock steps and sweeps, and checks every answer against a plain map. Without capacity
// pressure the answers must be identical; under it (evictions, compactions, in-flight
// relocations) the store may forget keys but must never claim one is done or in flight
// when it is not.
func TestStore_AgreesWithModel(t *testing.T) {
	tests := []struct {
		name    string
		maxKeys int
		keys    int
		exact   bool
		ttlJump bool // whether the clock sometimes jumps by a quarter of the TTL
	}{
		{name: "no capacity pressure, many shards", maxKeys: 1 << 17, keys: 300, exact: true, ttlJump: true},
		{name: "capacity pressure, one shard", maxKeys: 40, keys: 300, ttlJump: true},
		{name: "capacity pressure, several shards", maxKeys: 2048, keys: 20_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newClock()
			s := newTestStore(t, clock, tt.maxKeys)
			rng := rand.New(rand.NewPCG(1, uint64(tt.maxKeys)))
			model := map[string]*modelKey{}
			var held []heldLease
			nextID := 0
			live := func(m *modelKey) bool { return m != nil && clock.Now().Before(m.until) }

			for op := range 30_000 {
				// Every step moves the clock by an even number of nanoseconds, so that
				// lease and TTL instants are exact (see fakeClock).
				clock.Advance(time.Duration(2 + 2*rng.IntN(int(testLease/time.Millisecond)))) // up to ~4ms
				switch r := rng.IntN(100); {
				case r < 50:
					key := fmt.Sprint("k", rng.IntN(tt.keys))
					lease, status, rem := s.Begin(key)
					m := model[key]
					switch status {
					case idempotency.Done:
						require.True(t, live(m) && m.done, "op %d: %s reported done, model %+v", op, key, m)
					case idempotency.InFlight:
						require.True(t, live(m) && !m.done, "op %d: %s reported in flight, model %+v", op, key, m)
						require.Equal(t, m.until.Sub(clock.Now()), rem, "op %d: %s remaining lease", op, key)
					case idempotency.Acquired:
						if tt.exact {
							require.False(t, live(m), "op %d: %s acquired, model %+v", op, key, m)
						}
						nextID++
						model[key] = &modelKey{until: clock.Now().Add(testLease), holder: nextID}
						held = append(held, heldLease{key: key, id: nextID, lease: lease})
					}
				case r < 97 && len(held) > 0:
					i := rng.IntN(len(held))
					h := held[i]
					held[i] = held[len(held)-1]
					held = held[:len(held)-1]
					m := model[h.key]
					if r < 80 {
						s.Complete(h.lease)
						model[h.key] = &modelKey{done: true, until: clock.Now().Add(testTTL)}
					} else {
						s.Release(h.lease)
						if m != nil && !m.done && m.holder == h.id {
							delete(model, h.key)
						}
					}
				case r < 98:
					clock.Advance(testLease / 3)
				case r < 99 && tt.ttlJump:
					clock.Advance(testTTL / 4)
				default:
					s.Sweep()
					want := 0
					for _, m := range model {
						if live(m) {
							want++
						}
					}
					if tt.exact {
						require.Equal(t, want, s.Len(), "op %d: keys after Sweep", op)
					} else {
						require.LessOrEqual(t, s.Len(), want, "op %d: keys after Sweep", op)
					}
				}
				if !tt.exact && op%1000 == 0 {
					require.LessOrEqual(t, s.Len(), tt.maxKeys, "op %d", op)
				}
			}
			st := s.Stats()
			t.Logf("stats: %+v", st)
			if !tt.exact {
				require.NotZero(t, st.Evicted, "the pressure case must evict")
			}
		})
	}
}
