package idempotency

import "encoding/binary"

// index maps a key's digest to its record's position in the shard's fifo. It is an
// open-addressing table with linear probing of 8-byte slots (a fingerprint and a position),
// which costs about 15 bytes a key against some 45 for a Go map holding the digest again.
// Digests are uniformly random already, so their bits are the hash.
//
// A slot is fp<<32 | seq, and 0 when empty. fp is 31 bits of the digest with the top bit
// set, so an occupied slot is never 0, and its low bits are the home slot, so entries
// are rehashed and shifted without reading their records.
type index struct {
	slots []uint64
	n     int
}

const (
	fpOccupied = 1 << 31
	// maxLoad is the highest fraction of slots used (as a ratio, 3/4) before doubling.
	maxLoadNum, maxLoadDen = 3, 4
	minIndexSlots          = 16
)

func fingerprint(d digest) uint32 {
	return binary.LittleEndian.Uint32(d[8:12]) | fpOccupied
}

// find returns the slot holding d, or -1.
func (ix *index) find(d digest, q *fifo) int {
	if ix.n == 0 {
		return -1
	}
	fp := fingerprint(d)
	mask := len(ix.slots) - 1
	for i := int(fp) & mask; ; i = (i + 1) & mask {
		v := ix.slots[i]
		if v == 0 {
			return -1
		}
		if uint32(v>>32) == fp && q.at(uint32(v)).key == d {
			return i
		}
	}
}

func (ix *index) seq(slot int) uint32 { return uint32(ix.slots[slot]) }

func (ix *index) setSeq(slot int, seq uint32) {
	ix.slots[slot] = ix.slots[slot]&^0xffff_ffff | uint64(seq)
}

// add inserts d, which must be absent, at position seq.
func (ix *index) add(d digest, seq uint32) {
	if (ix.n+1)*maxLoadDen > len(ix.slots)*maxLoadNum {
		ix.resize(max(minIndexSlots, 2*len(ix.slots)))
	}
	ix.place(uint64(fingerprint(d))<<32 | uint64(seq))
	ix.n++
}

func (ix *index) place(v uint64) {
	mask := len(ix.slots) - 1
	for i := int(uint32(v>>32)) & mask; ; i = (i + 1) & mask {
		if ix.slots[i] == 0 {
			ix.slots[i] = v
			return
		}
	}
}

func (ix *index) resize(size int) {
	old := ix.slots
	ix.slots = make([]uint64, size)
	for _, v := range old {
		if v != 0 {
			ix.place(v)
		}
	}
}

// shrink halves the table while it would stay at most half full.
func (ix *index) shrink() {
	size := len(ix.slots)
	for size > minIndexSlots && ix.n*4 <= size {
		size /= 2
	}
	if size < len(ix.slots) {
		ix.resize(size)
	}
}

// del empties slot i, shifting later entries of its probe run back so that every entry
// stays reachable from its home slot without tombstones.
func (ix *index) del(i int) {
	mask := len(ix.slots) - 1
	for j := i; ; {
		j = (j + 1) & mask
		v := ix.slots[j]
		if v == 0 {
			break
		}
		// v may fill the hole at i unless its home k lies cyclically in (i, j].
		k := int(uint32(v>>32)) & mask
		if (i <= j && (k <= i || k > j)) || (i > j && k <= i && k > j) {
			ix.slots[i] = v
			i = j
		}
	}
	ix.slots[i] = 0
	ix.n--
}
