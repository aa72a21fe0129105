package idempotency

// A record is one key in a shard: 24 bytes, no pointers, so a million of them cost the
// garbage collector nothing to scan.
type record struct {
	key digest
	// exp is the Unix time in nanoseconds at which the record stops counting; its lowest
	// bit is the state (1 done, 0 in flight). An in-flight exp doubles as the holder's
	// lease token. tombstone marks a record removed out of FIFO order.
	exp int64
}

const tombstone int64 = -1 << 63

func (r *record) done() bool          { return r.exp&1 == 1 }
func (r *record) until() int64        { return r.exp &^ 1 }
func (r *record) dead() bool          { return r.exp == tombstone }
func (r *record) live(now int64) bool { return !r.dead() && r.until() > now }

// fifoChunk is the unit the queue grows and shrinks by, so that a shard's memory follows
// its key count instead of being reserved for its whole capacity up front, and growth
// never copies records (whose positions the shard's index holds).
const (
	fifoChunkBits = 9
	fifoChunkLen  = 1 << fifoChunkBits
	fifoChunkMask = fifoChunkLen - 1
)

type fifoChunk [fifoChunkLen]record

// fifo is a queue of records in insertion order, addressed by sequence numbers that stay
// valid while a record is queued. Sequence numbers are uint32 and wrap; since chunks are
// aligned to multiples of fifoChunkLen, which divides 2^32, the arithmetic stays exact as
// long as fewer than 2^32-fifoChunkLen records are queued (the MaxKeys limit, 2^30, is far below).
type fifo struct {
	chunks []*fifoChunk
	head   uint32 // sequence number of the oldest record
	tail   uint32 // sequence number the next push gets
	spare  *fifoChunk
}

func (f *fifo) len() int { return int(f.tail - f.head) }

func (f *fifo) at(seq uint32) *record {
	off := seq - (f.head &^ fifoChunkMask)
	return &f.chunks[off>>fifoChunkBits][off&fifoChunkMask]
}

func (f *fifo) front() *record { return f.at(f.head) }

func (f *fifo) push(r record) uint32 {
	off := f.tail - (f.head &^ fifoChunkMask)
	if int(off>>fifoChunkBits) == len(f.chunks) {
		c := f.spare
		if c == nil {
			c = new(fifoChunk)
		}
		f.spare = nil
		f.chunks = append(f.chunks, c)
	}
	f.chunks[off>>fifoChunkBits][off&fifoChunkMask] = r
	seq := f.tail
	f.tail++
	return seq
}

// pop drops the oldest record; a chunk is recycled once all its records are popped.
func (f *fifo) pop() {
	f.head++
	if f.head&fifoChunkMask == 0 {
		f.spare = f.chunks[0]
		copy(f.chunks, f.chunks[1:])
		f.chunks[len(f.chunks)-1] = nil
		f.chunks = f.chunks[:len(f.chunks)-1]
	}
}

// truncate drops every record from seq on; the caller has moved or removed them.
func (f *fifo) truncate(seq uint32) {
	f.tail = seq
	base := f.head &^ fifoChunkMask
	need := int((f.tail - base + fifoChunkMask) >> fifoChunkBits)
	for i := need; i < len(f.chunks); i++ {
		f.chunks[i] = nil
	}
	f.chunks = f.chunks[:need]
}
