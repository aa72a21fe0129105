package idempotency

import (
	"sync"
	"time"
)

// sweepBudget is how many expired records an operation removes beyond the one it may add,
// so that sweeping keeps up with any steady insert rate at a bounded cost per call.
const sweepBudget = 2

// maxRelocations bounds how many live in-flight records an insert into a full shard moves
// to the back instead of evicting, before it evicts whatever is oldest.
const maxRelocations = 8

// cacheLineBytes is the cache line size of the CPUs sluice runs on (amd64, arm64).
const cacheLineBytes = 64

// Shard counts: up to maxShards (lock striping), but never so many that a shard holds fewer
// than minShardKeys, so that a small store still evicts in global insertion order.
const (
	maxShards    = 64
	minShardKeys = 1024
)

// shard is one lock stripe: the records in insertion order, which is the eviction order,
// and an index from key to position.
type shard struct {
	mu    sync.Mutex
	ix    index
	q     fifo
	cap   int
	tombs int // tombstones in q: records removed out of order, awaiting compaction
	// lastToken keeps lease tokens unique within the shard when the clock stands still
	// (tests, coarse clocks); see nextToken.
	lastToken int64
	st        counters
	_         [cacheLineBytes]byte // keeps neighbouring shards' locks off one cache line
}

type counters struct {
	hits, inFlight, acquired, completed, released, takeovers, evicted, expired uint64
}

// nextToken returns the in-flight exp t (even), moved just past the previous token when the
// clock has not advanced since. A clock stepped back further is taken as it is, rather than
// lengthening every lease by the step; a token then repeats only if the same key is taken
// at the same nanosecond as before the step.
func (sh *shard) nextToken(t int64) int64 {
	t &^= 1
	if t <= sh.lastToken && sh.lastToken-t < int64(time.Millisecond) {
		t = sh.lastToken + 2
	}
	sh.lastToken = t
	return t
}

// remove forgets the record indexed at slot: popped if it is the oldest, else left as a
// tombstone.
func (sh *shard) remove(slot int) {
	seq := sh.ix.seq(slot)
	r := sh.q.at(seq)
	sh.ix.del(slot)
	if seq == sh.q.head {
		sh.q.pop()
		return
	}
	r.exp = tombstone
	sh.tombs++
}

// sweep pops tombstones and up to budget expired records from the front of the queue.
func (sh *shard) sweep(now int64, budget int) {
	for sh.q.len() > 0 {
		r := sh.q.front()
		if r.dead() {
			sh.q.pop()
			sh.tombs--
			continue
		}
		if budget == 0 || r.live(now) {
			return
		}
		sh.ix.del(sh.ix.find(r.key, &sh.q))
		sh.q.pop()
		sh.st.expired++
		budget--
	}
}

// insert appends r, first making room if the shard is full: by compacting when tombstones
// take at least an eighth of it (so live keys always get seven eighths of the capacity,
// at an amortized cost of at most eight moves per removal), else by evicting the oldest
// record. A live in-flight record is moved to the back rather than evicted (a few times
// per insert), because forgetting it would let a duplicate run beside its holder.
func (sh *shard) insert(r record, now int64) {
	moved := 0
	for sh.q.len() >= sh.cap {
		if sh.tombs > 0 && sh.tombs*8 >= sh.cap {
			sh.compact()
			continue
		}
		h := *sh.q.front()
		if h.dead() {
			sh.q.pop()
			sh.tombs--
			continue
		}
		slot := sh.ix.find(h.key, &sh.q) // before the pop: find reads the record
		sh.q.pop()
		if !h.done() && h.live(now) && moved < maxRelocations {
			sh.ix.setSeq(slot, sh.q.push(h))
			moved++
		} else {
			sh.ix.del(slot)
			if h.live(now) {
				sh.st.evicted++
			} else {
				sh.st.expired++
			}
		}
	}
	sh.ix.add(r.key, sh.q.push(r))
}

// compact closes the gaps tombstones leave, keeping insertion order.
func (sh *shard) compact() {
	if sh.tombs == 0 {
		return
	}
	w := sh.q.head
	for rd := sh.q.head; rd != sh.q.tail; rd++ {
		r := sh.q.at(rd)
		if r.dead() {
			continue
		}
		if rd != w {
			slot := sh.ix.find(r.key, &sh.q)
			*sh.q.at(w) = *r
			sh.ix.setSeq(slot, w)
		}
		w++
	}
	sh.q.truncate(w)
	sh.tombs = 0
}
