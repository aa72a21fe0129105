package idempotency

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// Snapshot file layout, little-endian:
//
//	magic    [8]byte  "sluiceik"
//	version  uint32   1
//	reserved uint32   0
//	count    uint64
//	count ×  { digest [16]byte; expires int64 (Unix ns) }, oldest expiry first
//	crc      uint32   CRC-32C of everything before it
//
// Only done keys are written: an in-flight key's holder is gone after a restart, and its
// message will be redelivered anyway.
const (
	snapshotMagic      = "sluiceik"
	snapshotVersion    = 1
	snapshotHeaderSize = 8 + 4 + 4 + 8
	snapshotRecordSize = 16 + 8
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// ErrSnapshotCorrupt is wrapped by LoadSnapshot's error when the file is not a complete
// snapshot written by this package.
var ErrSnapshotCorrupt = errors.New("idempotency: snapshot corrupt")

// SaveSnapshot writes the done keys whose TTL has not run out to path, atomically: into a
// temporary file beside it, synced, then renamed over path. A crash during the write
// leaves the previous snapshot in place. Keys in flight are not written.
func (s *Store) SaveSnapshot(path string) (err error) {
	now := s.now().UnixNano()
	var recs []record
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for seq := sh.q.head; seq != sh.q.tail; seq++ {
			if r := sh.q.at(seq); r.done() && r.live(now) {
				recs = append(recs, *r)
			}
		}
		sh.mu.Unlock()
	}
	// Oldest expiry first, so a load into a smaller store evicts what would expire first.
	slices.SortFunc(recs, func(a, b record) int {
		switch {
		case a.exp < b.exp:
			return -1
		case a.exp > b.exp:
			return 1
		}
		return 0
	})

	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("idempotency: create snapshot beside %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()

	crc := crc32.New(crcTable)
	w := bufio.NewWriterSize(io.MultiWriter(tmp, crc), 64<<10)
	var buf [snapshotHeaderSize]byte
	copy(buf[:8], snapshotMagic)
	binary.LittleEndian.PutUint32(buf[8:], snapshotVersion)
	binary.LittleEndian.PutUint64(buf[16:], uint64(len(recs)))
	_, _ = w.Write(buf[:])
	var rb [snapshotRecordSize]byte
	for _, r := range recs {
		copy(rb[:16], r.key[:])
		binary.LittleEndian.PutUint64(rb[16:], uint64(r.until()))
		_, _ = w.Write(rb[:])
	}
	if err = w.Flush(); err != nil {
		return fmt.Errorf("idempotency: write snapshot %s: %w", tmp.Name(), err)
	}
	if err = binary.Write(tmp, binary.LittleEndian, crc.Sum32()); err != nil {
		return fmt.Errorf("idempotency: write snapshot %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("idempotency: sync snapshot %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("idempotency: close snapshot %s: %w", tmp.Name(), err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("idempotency: rename snapshot to %s: %w", path, err)
	}
	// The rename is durable only once the directory is synced; a failure here leaves a
	// valid snapshot that might not survive a power loss, which is not worth failing for.
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// LoadSnapshot adds the done keys in the snapshot at path whose TTL has not run out. A key
// the store already holds keeps its state. The file is checked whole before anything is
// added, so a corrupt file (ErrSnapshotCorrupt) changes nothing.
func (s *Store) LoadSnapshot(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("idempotency: open snapshot: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("idempotency: stat snapshot %s: %w", path, err)
	}
	size := fi.Size()
	if size < snapshotHeaderSize+4 {
		return fmt.Errorf("%w: %s is %d bytes, shorter than a header", ErrSnapshotCorrupt, path, size)
	}
	crc := crc32.New(crcTable)
	r := bufio.NewReaderSize(io.TeeReader(io.LimitReader(f, size-4), crc), 64<<10)
	var hdr [snapshotHeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return fmt.Errorf("idempotency: read snapshot %s: %w", path, err)
	}
	if string(hdr[:8]) != snapshotMagic {
		return fmt.Errorf("%w: %s has magic %q, want %q", ErrSnapshotCorrupt, path, hdr[:8], snapshotMagic)
	}
	if v := binary.LittleEndian.Uint32(hdr[8:]); v != snapshotVersion {
		return fmt.Errorf("%w: %s has version %d, want %d", ErrSnapshotCorrupt, path, v, snapshotVersion)
	}
	count := binary.LittleEndian.Uint64(hdr[16:])
	if want := uint64(size-snapshotHeaderSize-4) / snapshotRecordSize; count != want || uint64(size-snapshotHeaderSize-4)%snapshotRecordSize != 0 {
		return fmt.Errorf("%w: %s claims %d keys in %d bytes", ErrSnapshotCorrupt, path, count, size)
	}
	recs := make([]record, count)
	var rb [snapshotRecordSize]byte
	for i := range recs {
		if _, err := io.ReadFull(r, rb[:]); err != nil {
			return fmt.Errorf("idempotency: read snapshot %s: %w", path, err)
		}
		recs[i].key = digest(rb[:16])
		recs[i].exp = int64(binary.LittleEndian.Uint64(rb[16:]))&^1 | 1
	}
	var sum uint32
	if err := binary.Read(f, binary.LittleEndian, &sum); err != nil {
		return fmt.Errorf("idempotency: read snapshot %s checksum: %w", path, err)
	}
	if sum != crc.Sum32() {
		return fmt.Errorf("%w: %s checksum %08x, computed %08x", ErrSnapshotCorrupt, path, sum, crc.Sum32())
	}

	now := s.now().UnixNano()
	for _, rec := range recs {
		if !rec.live(now) {
			continue
		}
		sh := s.shardOf(rec.key)
		sh.mu.Lock()
		if sh.ix.find(rec.key, &sh.q) < 0 {
			sh.insert(rec, now)
		}
		sh.mu.Unlock()
	}
	return nil
}

func (s *Store) loadIfExists(path string) error {
	err := s.LoadSnapshot(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
