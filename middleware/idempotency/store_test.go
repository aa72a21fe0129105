package idempotency_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/middleware/idempotency"
)

const (
	testTTL   = time.Hour
	testLease = 2 * time.Minute
)

func newTestStore(t *testing.T, clock *fakeClock, maxKeys int) *idempotency.Store {
	t.Helper()
	s, err := idempotency.NewStore(idempotency.Config{
		TTL: testTTL, Lease: testLease, MaxKeys: maxKeys, Now: clock.Now,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// step is one operation in a store scenario. Leases are kept per holder, which defaults
// to the key, so that two holders of one key can be told apart.
type step struct {
	do      string // begin, complete, release, advance
	key     string
	holder  string
	d       time.Duration // for advance
	want    idempotency.Status
	wantRem time.Duration // remaining lease, for a begin that wants InFlight
}

func TestStore_Lifecycle(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "completed key is done", steps: []step{
			{do: "begin", key: "a", want: idempotency.Acquired},
			{do: "complete", key: "a"},
			{do: "begin", key: "a", want: idempotency.Done},
			{do: "begin", key: "b", want: idempotency.Acquired},
		}},
		{name: "released key can be taken again", steps: []step{
			{do: "begin", key: "a", want: idempotency.Acquired},
			{do: "release", key: "a"},
			{do: "begin", key: "a", want: idempotency.Acquired},
			{do: "complete", key: "a"},
			{do: "begin", key: "a", want: idempotency.Done},
		}},
		{name: "in flight reports the rest of the lease", steps: []step{
			{do: "begin", key: "a", want: idempotency.Acquired},
			{do: "advance", d: 30 * time.Second},
			{do: "begin", key: "a", want: idempotency.InFlight, wantRem: testLease - 30*time.Second},
		}},
		{name: "TTL runs out", steps: []step{
			{do: "begin", key: "a", want: idempotency.Acquired},
			{do: "complete", key: "a"},
			{do: "advance", d: testTTL - time.Nanosecond},
			{do: "begin", key: "a", want: idempotency.Done},
			{do: "advance", d: time.Nanosecond},
			{do: "begin", key: "a", want: idempotency.Acquired},
		}},
		{name: "lease runs out when the holder dies", steps: []step{
			{do: "begin", key: "a", holder: "dead", want: idempotency.Acquired},
			{do: "advance", d: testLease - time.Nanosecond},
			{do: "begin", key: "a", want: idempotency.InFlight, wantRem: time.Nanosecond},
			{do: "advance", d: time.Nanosecond},
			{do: "begin", key: "a", holder: "next", want: idempotency.Acquired},
			{do: "complete", key: "a", holder: "next"},
			{do: "begin", key: "a", want: idempotency.Done},
		}},
		{name: "stale holder cannot release a key taken over", steps: []step{
			{do: "begin", key: "a", holder: "slow", want: idempotency.Acquired},
			{do: "advance", d: testLease},
			{do: "begin", key: "a", holder: "next", want: idempotency.Acquired},
			{do: "release", key: "a", holder: "slow"},
			{do: "begin", key: "a", want: idempotency.InFlight, wantRem: testLease},
		}},
		{name: "stale holder's completion marks the key done", steps: []step{
			{do: "begin", key: "a", holder: "slow", want: idempotency.Acquired},
			{do: "advance", d: testLease},
			{do: "begin", key: "a", holder: "next", want: idempotency.Acquired},
			{do: "complete", key: "a", holder: "slow"},
			{do: "begin", key: "a", want: idempotency.Done},
			{do: "release", key: "a", holder: "next"},
			{do: "begin", key: "a", want: idempotency.Done},
		}},
		{name: "zero lease is ignored", steps: []step{
			{do: "begin", key: "a", want: idempotency.Acquired},
			{do: "complete", key: "a"},
			{do: "begin", key: "a", holder: "dup", want: idempotency.Done},
			{do: "release", key: "a", holder: "dup"},
			{do: "complete", key: "b", holder: "never-began"},
			{do: "begin", key: "a", want: idempotency.Done},
			{do: "begin", key: "b", want: idempotency.Acquired},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newClock()
			s := newTestStore(t, clock, 100)
			leases := map[string]idempotency.Lease{}
			for i, st := range tt.steps {
				holder := st.holder
				if holder == "" {
					holder = st.key
				}
				switch st.do {
				case "begin":
					lease, status, rem := s.Begin(st.key)
					require.Equal(t, st.want, status, "step %d: begin %q", i, st.key)
					assert.Equal(t, st.wantRem, rem, "step %d: remaining lease", i)
					leases[holder] = lease
				case "complete":
					s.Complete(leases[holder])
				case "release":
					s.Release(leases[holder])
				case "advance":
					clock.Advance(st.d)
				default:
					t.Fatalf("step %d: unknown op %q", i, st.do)
				}
			}
		})
	}
}

func complete(t *testing.T, s *idempotency.Store, key string) {
	t.Helper()
	lease, status, _ := s.Begin(key)
	require.Equal(t, idempotency.Acquired, status, "begin %q", key)
	s.Complete(lease)
}

func TestStore_CapacityEvictsOldestFirst(t *testing.T) {
	tests := []struct {
		name    string
		maxKeys int
		inserts int
		// newest keys that must be kept and oldest keys that must be gone
		keptNewest, goneOldest int
	}{
		{name: "one shard is exact FIFO", maxKeys: 4, inserts: 5, keptNewest: 4, goneOldest: 1},
		{name: "one shard, many evictions", maxKeys: 1000, inserts: 2500, keptNewest: 1000, goneOldest: 1500},
		{name: "several shards evict their own oldest", maxKeys: 4096, inserts: 8192, keptNewest: 512, goneOldest: 512},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestStore(t, newClock(), tt.maxKeys)
			for i := range tt.inserts {
				complete(t, s, fmt.Sprint("k", i))
			}
			st := s.Stats()
			assert.Equal(t, tt.maxKeys, st.Keys)
			assert.Equal(t, uint64(tt.inserts-tt.maxKeys), st.Evicted)
			for i := tt.inserts - tt.keptNewest; i < tt.inserts; i++ {
				_, status, _ := s.Begin(fmt.Sprint("k", i))
				require.Equal(t, idempotency.Done, status, "newest key k%d", i)
			}
			for i := range tt.goneOldest {
				_, status, _ := s.Begin(fmt.Sprint("k", i))
				require.Equal(t, idempotency.Acquired, status, "oldest key k%d", i)
			}
		})
	}
}

func TestStore_FullStoreKeepsKeysInFlight(t *testing.T) {
	s := newTestStore(t, newClock(), 2)
	_, status, _ := s.Begin("flying")
	require.Equal(t, idempotency.Acquired, status)
	complete(t, s, "old")
	complete(t, s, "new") // full: "flying" is oldest but held, so "old" goes

	_, status, _ = s.Begin("flying")
	assert.Equal(t, idempotency.InFlight, status)
	_, status, _ = s.Begin("new")
	assert.Equal(t, idempotency.Done, status)
	assert.Equal(t, uint64(1), s.Stats().Evicted)
}

func TestStore_ReleasedKeysDoNotEvictDoneKeys(t *testing.T) {
	// Failed attempts leave placeholders behind; compaction must reclaim them before a
	// full store evicts a done key.
	const maxKeys = 8
	s := newTestStore(t, newClock(), maxKeys)
	for i := range maxKeys - 2 {
		complete(t, s, fmt.Sprint("done", i))
	}
	for i := range 100 {
		x, status, _ := s.Begin(fmt.Sprint("x", i))
		require.Equal(t, idempotency.Acquired, status)
		y, status, _ := s.Begin(fmt.Sprint("y", i))
		require.Equal(t, idempotency.Acquired, status)
		s.Release(x)
		s.Release(y)
	}
	st := s.Stats()
	assert.Zero(t, st.Evicted)
	assert.Equal(t, uint64(200), st.Released)
	for i := range maxKeys - 2 {
		_, status, _ := s.Begin(fmt.Sprint("done", i))
		assert.Equal(t, idempotency.Done, status, "done%d", i)
	}
}

func TestStore_ExpiredKeysAreRemoved(t *testing.T) {
	tests := []struct {
		name string
		// after the TTL: how the old keys go away
		remove   func(t *testing.T, s *idempotency.Store)
		wantKeys int
	}{
		{name: "swept a few at a time by inserts", remove: func(t *testing.T, s *idempotency.Store) {
			for i := range 100 {
				complete(t, s, fmt.Sprint("new", i))
			}
		}, wantKeys: 100},
		{name: "all at once by Sweep", remove: func(t *testing.T, s *idempotency.Store) {
			s.Sweep()
		}, wantKeys: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newClock()
			s := newTestStore(t, clock, 1000) // one shard: sweeping order is exact
			for i := range 100 {
				complete(t, s, fmt.Sprint("old", i))
			}
			require.Equal(t, 100, s.Len())
			clock.Advance(testTTL)
			tt.remove(t, s)
			st := s.Stats()
			assert.Equal(t, tt.wantKeys, st.Keys)
			assert.Equal(t, uint64(100), st.Expired)
		})
	}
}

func TestStore_SweepShrinksAcrossShards(t *testing.T) {
	clock := newClock()
	s := newTestStore(t, clock, 1<<20)
	for i := range 20_000 {
		complete(t, s, fmt.Sprint("k", i))
	}
	_, status, _ := s.Begin("held")
	require.Equal(t, idempotency.Acquired, status)
	clock.Advance(testLease - time.Second)
	s.Sweep()
	assert.Equal(t, 20_001, s.Len(), "nothing expired yet")
	clock.Advance(testTTL)
	s.Sweep()
	assert.Zero(t, s.Len())
	complete(t, s, "k1") // still usable after its maps were rebuilt
	_, status, _ = s.Begin("k1")
	assert.Equal(t, idempotency.Done, status)
}

func TestStore_ConcurrentBeginsOnSameKeys(t *testing.T) {
	// Many goroutines race for the same keys: a key has at most one holder at a time, its
	// first holder fails (releases), and exactly one later holder completes it.
	const (
		goroutines = 32
		keys       = 50
		rounds     = 200
	)
	s := newTestStore(t, newClock(), 1000)
	var acquisitions, completions, holders [keys]atomic.Int32
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for r := range rounds {
				k := (g + r) % keys
				lease, status, _ := s.Begin(fmt.Sprint("key", k))
				if status != idempotency.Acquired {
					continue
				}
				if n := holders[k].Add(1); n != 1 {
					t.Errorf("key%d has %d holders", k, n)
				}
				first := acquisitions[k].Add(1) == 1
				holders[k].Add(-1)
				if first {
					s.Release(lease)
					continue
				}
				completions[k].Add(1)
				s.Complete(lease)
			}
		})
	}
	wg.Wait()
	for k := range keys {
		assert.Equal(t, int32(2), acquisitions[k].Load(), "key%d acquisitions", k)
		assert.Equal(t, int32(1), completions[k].Load(), "key%d completions", k)
	}
}

func TestStore_StaleLeaseCannotReleaseANewHolder(t *testing.T) {
	// With the clock standing still, a key evicted while held and taken again must get a
	// new lease token, so that the evicted holder's Release leaves the new holder's key.
	s := newTestStore(t, newClock(), 1)
	stale, status, _ := s.Begin("a")
	require.Equal(t, idempotency.Acquired, status)
	complete(t, s, "b") // a store of one key must evict "a", though it is in flight
	current, status, _ := s.Begin("a")
	require.Equal(t, idempotency.Acquired, status)

	s.Release(stale)
	_, status, _ = s.Begin("a")
	assert.Equal(t, idempotency.InFlight, status, "the stale lease released nothing")
	s.Release(current)
	_, status, _ = s.Begin("a")
	assert.Equal(t, idempotency.Acquired, status)
}
