package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sync"
	"time"
)

// digest is what the store keeps of a key: the first 128 bits of its SHA-256. Keys of any
// length then cost the same 16 bytes, are never held in clear text (nor written to a
// snapshot), and two keys collide with probability about n²/2^129 (1e-27 at a million keys),
// even when a producer chooses keys adversarially. SHA-256 rather than a seeded hash keeps
// digests stable across restarts, which snapshots need.
type digest [16]byte

func sumBytes(b []byte) digest {
	s := sha256.Sum256(b)
	return digest(s[:16])
}

// keyStatus is what beginKey found for a key.
type keyStatus uint8

const (
	// keyAcquired means the caller now holds the key and must end its keyLease with
	// complete or release.
	keyAcquired keyStatus = iota + 1
	// keyDone means the key completed within its TTL: the message is a duplicate.
	keyDone
	// keyInFlight means another holder's lease on the key is still running.
	keyInFlight
)

// String returns the status name.
func (s keyStatus) String() string {
	switch s {
	case keyAcquired:
		return "acquired"
	case keyDone:
		return "done"
	case keyInFlight:
		return "in_flight"
	default:
		return fmt.Sprintf("status(%d)", uint8(s))
	}
}

// keyLease is a holder's claim on a key, returned by beginKey with keyAcquired. Its zero
// value is no claim: complete and release ignore it.
type keyLease struct {
	key digest
	// token is the in-flight record's exp when it was acquired; a later holder of the
	// same key gets a different one, so a stale holder cannot release it.
	token int64
}

// Store is the in-memory idempotency store: keys in flight (with a lease) and keys done
// (for a TTL), at most MaxKeys of them, oldest forgotten first. It runs no goroutine:
// expired keys are dropped when met and swept a few at a time on every operation, so it
// needs Close only to write its snapshot. All methods are safe for concurrent use.
type Store struct {
	shards []shard
	mask   uint64
	ttl    int64
	lease  int64
	now    func() time.Time
	path   string

	closeOnce sync.Once
	closeErr  error
}

// newStore returns an empty store configured by cfg (KeyFunc, InFlightDeferral and
// OnDuplicate are not used by the store), with cfg.SnapshotPath loaded if that file exists.
func newStore(cfg Config) (*Store, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	n := maxShards
	for n > 1 && cfg.MaxKeys/n < minShardKeys {
		n /= 2
	}
	s := &Store{
		shards: make([]shard, n),
		mask:   uint64(n - 1),
		ttl:    int64(cfg.TTL),
		lease:  int64(cfg.Lease),
		now:    cfg.Now,
		path:   cfg.SnapshotPath,
	}
	for i := range s.shards {
		s.shards[i].cap = cfg.MaxKeys / n
		if i < cfg.MaxKeys%n {
			s.shards[i].cap++
		}
	}
	if s.path != "" {
		if err := s.loadIfExists(s.path); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Store) shardOf(d digest) *shard {
	return &s.shards[binary.LittleEndian.Uint64(d[:8])&s.mask]
}

// beginKey claims key. With keyAcquired, the caller holds key until it calls complete or
// release with the returned keyLease, or the lease runs out. With keyDone, key completed
// within its TTL. With keyInFlight, another holder has it; the duration is what is left of
// that lease. Only the tests claim plain keys: the step claims scoped digests (begin).
func (s *Store) beginKey(key string) (keyLease, keyStatus, time.Duration) {
	// A plain []byte(key) allocates for keys over 32 bytes (a UUID is 36); a larger stack
	// buffer does not for usual key sizes.
	var buf [128]byte
	return s.begin(sumBytes(append(buf[:0], key...)))
}

func (s *Store) begin(d digest) (keyLease, keyStatus, time.Duration) {
	now := s.now().UnixNano()
	sh := s.shardOf(d)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweep(now, sweepBudget)
	if slot := sh.ix.find(d, &sh.q); slot >= 0 {
		r := sh.q.at(sh.ix.seq(slot))
		switch {
		case r.live(now) && r.done():
			sh.st.hits++
			return keyLease{}, keyDone, 0
		case r.live(now):
			sh.st.inFlight++
			return keyLease{}, keyInFlight, time.Duration(r.until() - now)
		case r.done():
			sh.st.expired++
		default:
			// The holder's lease ran out: it died or overran; the key is free again.
			sh.st.takeovers++
		}
		sh.remove(slot)
	}
	token := sh.nextToken(now + s.lease)
	sh.insert(record{key: d, exp: token}, now)
	sh.st.acquired++
	return keyLease{key: d, token: token}, keyAcquired, 0
}

// complete marks the leased key done for the TTL from now. It does so even if the lease ran
// out and another holder took the key meanwhile: the caller's work did happen, so later
// duplicates must be acknowledged. A key forgotten meanwhile (capacity) is added back.
func (s *Store) complete(l keyLease) {
	if l.token == 0 {
		return
	}
	now := s.now().UnixNano()
	exp := (now+s.ttl)&^1 | 1
	sh := s.shardOf(l.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweep(now, sweepBudget)
	sh.st.completed++
	if slot := sh.ix.find(l.key, &sh.q); slot >= 0 {
		sh.q.at(sh.ix.seq(slot)).exp = exp
		return
	}
	sh.insert(record{key: l.key, exp: exp}, now)
}

// doneRecord is the record complete would write for l now, for the journal to carry
// before the store is changed.
func (s *Store) doneRecord(l keyLease) record {
	return record{key: l.key, exp: (s.now().UnixNano()+s.ttl)&^1 | 1}
}

// completeAs ends l as complete does, with rec's expiry (the one journaled).
func (s *Store) completeAs(l keyLease, rec record) {
	if l.token == 0 {
		return
	}
	now := s.now().UnixNano()
	sh := s.shardOf(l.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweep(now, sweepBudget)
	sh.st.completed++
	if slot := sh.ix.find(l.key, &sh.q); slot >= 0 {
		sh.q.at(sh.ix.seq(slot)).exp = rec.exp
		return
	}
	sh.insert(rec, now)
}

// markDone records a journaled key as done until rec's expiry, unless the store knows it
// done for longer. A key in flight here is marked done too: its work happened elsewhere,
// and this attempt's release then leaves it done. Records arrive oldest first, so when
// the journal holds more than MaxKeys the newest are the ones kept.
func (s *Store) markDone(rec record, now int64) {
	if !rec.live(now) {
		return
	}
	sh := s.shardOf(rec.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweep(now, sweepBudget)
	if slot := sh.ix.find(rec.key, &sh.q); slot >= 0 {
		if r := sh.q.at(sh.ix.seq(slot)); !r.done() || r.until() < rec.until() {
			r.exp = rec.exp
		}
		return
	}
	sh.insert(rec, now)
}

// release gives the leased key up without marking it, so that the next attempt runs. It
// does nothing if the key is no longer held under this lease (it ran out and another
// holder took the key, or the key completed).
func (s *Store) release(l keyLease) {
	if l.token == 0 {
		return
	}
	sh := s.shardOf(l.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if slot := sh.ix.find(l.key, &sh.q); slot >= 0 {
		if r := sh.q.at(sh.ix.seq(slot)); !r.done() && r.exp == l.token {
			sh.remove(slot)
			sh.st.released++
		}
	}
}

// Len returns the number of keys held, done or in flight. Keys whose TTL or lease ran out
// are counted until they are swept.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.ix.n
		sh.mu.Unlock()
	}
	return n
}

// Sweep removes every key whose TTL or lease has run out and returns the memory it can.
// The store never needs it for correctness (an expired key is ignored when met); call it
// to shrink an idle store. It holds one shard's lock at a time, for a pass over that shard.
func (s *Store) Sweep() {
	now := s.now().UnixNano()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for seq := sh.q.head; seq != sh.q.tail; seq++ {
			if r := sh.q.at(seq); !r.dead() && !r.live(now) {
				sh.ix.del(sh.ix.find(r.key, &sh.q))
				r.exp = tombstone
				sh.tombs++
				sh.st.expired++
			}
		}
		sh.compact()
		sh.ix.shrink()
		sh.mu.Unlock()
	}
}

// Stats counts what the store did since it was created.
type Stats struct {
	// Keys is the number of keys held now (see Store.Len).
	Keys int
	// Hits counts duplicates of done keys: acknowledged without calling the handler.
	Hits uint64
	// InFlightHits counts duplicates of keys in flight: deferred broker-side.
	InFlightHits uint64
	// Acquired counts keys claimed by an attempt.
	Acquired uint64
	// Completed counts leases ended by a done attempt.
	Completed uint64
	// Released counts leases given up by a failed attempt.
	Released uint64
	// Takeovers counts keys claimed after their holder's lease ran out.
	Takeovers uint64
	// Evicted counts keys forgotten for capacity before their TTL or lease ran out.
	Evicted uint64
	// Expired counts keys removed after their TTL or lease ran out.
	Expired uint64
	// KeyErrors counts messages whose KeyFunc failed (Guard only).
	KeyErrors uint64
	// NoKey counts messages with no key at all, handled without idempotency (Guard only).
	NoKey uint64
	// Journal counts the journal's work (Guard only; zero without Guard.Journaled).
	Journal JournalStats
}

// JournalStats counts what a Guard's journals did (Guard.Journaled).
type JournalStats struct {
	// Restoring is how many journals have not caught up yet: the stack does not consume
	// their handlers meanwhile.
	Restoring int
	// Restored counts the records read while restoring.
	Restored int64
	// RestoreDuration is the longest restore, from Journaled to caught up.
	RestoreDuration time.Duration
	// Applied counts every record read (restore, own appends and other instances').
	Applied int64
	// Appended counts records confirmed by the broker, in Batches journal messages.
	Appended, Batches int64
	// Failures counts appends that failed (their messages were deferred).
	Failures int64
	// Skipped counts journal messages that were not record batches (corrupt, foreign).
	Skipped int64
	// Lag is the age of the last record read after the restore: how long a key done on
	// one instance took to be known here.
	Lag time.Duration
	// Unconfirmed is how many keys are done here but not journaled yet.
	Unconfirmed int
	// BlockedAcks counts messages acknowledged before their record was journaled because
	// the broker blocked publishing (a memory or disk alarm); their records follow once it
	// clears.
	BlockedAcks int64
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	var st Stats
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Keys += sh.ix.n
		st.Hits += sh.st.hits
		st.InFlightHits += sh.st.inFlight
		st.Acquired += sh.st.acquired
		st.Completed += sh.st.completed
		st.Released += sh.st.released
		st.Takeovers += sh.st.takeovers
		st.Evicted += sh.st.evicted
		st.Expired += sh.st.expired
		sh.mu.Unlock()
	}
	return st
}

// Close writes the snapshot if Config.SnapshotPath is set. The store keeps working after
// Close (in memory only), and a second Close does nothing and returns nil.
func (s *Store) Close() error {
	first := false
	s.closeOnce.Do(func() {
		first = true
		if s.path != "" {
			s.closeErr = s.SaveSnapshot(s.path)
		}
	})
	if !first {
		return nil
	}
	return s.closeErr
}
