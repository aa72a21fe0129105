// Package outboxstore is the file behind package outbox: a bbolt file of pending and
// rejected entries, bounded in entries and bytes, whose appends are fsynced in batches.
// outbox re-exports its sentinel errors (ErrFull, ErrClosed).
package outboxstore

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// FileName is the name of the outbox file in outbox.Config.Dir.
const FileName = "sluice-outbox.db"

// Errors outbox re-exports under the same names.
var (
	// ErrFull means the store holds its maximum of entries or bytes already.
	ErrFull = errors.New("outbox: full")
	// ErrClosed is returned by a closed store.
	ErrClosed = errors.New("outbox: closed")
)

var (
	bucketPending  = []byte("pending")
	bucketRejected = []byte("rejected")
)

// Entry is one message kept in the outbox, with the topic it is to be published to.
type Entry struct {
	// Seq orders entries: the forwarder publishes them in ascending Seq.
	Seq uint64 `json:"-"`
	// Topic is the topic the producer gave Publish.
	Topic string `json:"topic"`
	// UUID, Metadata and Payload are the message's.
	UUID     string            `json:"uuid"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Payload  []byte            `json:"payload"`
	// Reason says why a rejected entry was set aside; empty for pending ones.
	Reason string `json:"reason,omitempty"`
}

// Message rebuilds the Watermill message of e.
func (e Entry) Message() *message.Message {
	m := message.NewMessage(e.UUID, e.Payload)
	for k, v := range e.Metadata {
		m.Metadata.Set(k, v)
	}
	return m
}

func NewEntry(topic string, m *message.Message) Entry {
	md := make(map[string]string, len(m.Metadata))
	for k, v := range m.Metadata {
		md[k] = v
	}
	return Entry{Topic: topic, UUID: m.UUID, Metadata: md, Payload: m.Payload}
}

// Store is the outbox file: a bbolt database whose every write is fsynced before it
// returns. Appends from concurrent callers are committed together (one fsync for all
// that arrived while the previous commit ran), in the order they arrived.
type Store struct {
	db         *bolt.DB
	maxEntries int
	maxBytes   int64

	mu      sync.Mutex // guards the counters below
	entries int
	bytes   int64

	appends chan *appendReq
	closing chan struct{}
	done    chan struct{}
	once    sync.Once
}

type appendReq struct {
	entries []Entry
	result  chan error
}

// OpenStore opens (or creates) the outbox file in dir. An outbox holds at most maxEntries
// messages of at most maxBytes encoded bytes in all; appends beyond either fail with
// ErrFull.
func OpenStore(dir string, maxEntries int, maxBytes int64) (*Store, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("outbox: create directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, FileName)
	// A second process on the same file would interleave two producers' orders: bbolt's
	// file lock makes it wait, and the timeout turns the wait into an error.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("outbox: open %s: %w", path, err)
	}
	s := &Store{
		db: db, maxEntries: maxEntries, maxBytes: maxBytes,
		appends: make(chan *appendReq, 64),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketPending, bucketRejected} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketPending).ForEach(func(_, v []byte) error {
			s.entries++
			s.bytes += int64(len(v))
			return nil
		})
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("outbox: read %s: %w", path, err)
	}
	go s.writer()
	return s, nil
}

// Len returns the number of pending entries and their encoded size in bytes.
func (s *Store) Len() (entries int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.entries, s.bytes
}

// Append writes entries durably, in order, behind those already pending. It returns once
// they are fsynced, or ErrFull when they do not fit.
func (s *Store) Append(entries []Entry) error {
	req := &appendReq{entries: entries, result: make(chan error, 1)}
	select {
	case s.appends <- req:
	case <-s.closing:
		return ErrClosed
	}
	select {
	case err := <-req.result:
		return err
	case <-s.done:
		// The writer answers every request it took before it ends; look once more.
		select {
		case err := <-req.result:
			return err
		default:
			return ErrClosed
		}
	}
}

// writer commits the appends waiting in the queue together: one transaction and one
// fsync for all the requests that queued up during the previous commit.
func (s *Store) writer() {
	defer close(s.done)
	for {
		var batch []*appendReq
		select {
		case req := <-s.appends:
			batch = append(batch, req)
		case <-s.closing:
			s.refuseQueued()
			return
		}
	more:
		for len(batch) < 256 {
			select {
			case req := <-s.appends:
				batch = append(batch, req)
			default:
				break more
			}
		}
		s.commit(batch)
	}
}

func (s *Store) refuseQueued() {
	for {
		select {
		case req := <-s.appends:
			req.result <- ErrClosed
		default:
			return
		}
	}
}

func (s *Store) commit(batch []*appendReq) {
	type encoded struct {
		vals  [][]byte
		bytes int64
		err   error
	}
	enc := make([]encoded, len(batch))
	s.mu.Lock()
	entries, bytes := s.entries, s.bytes
	s.mu.Unlock()
	accepted := 0
	for i, req := range batch {
		for _, e := range req.entries {
			v, err := json.Marshal(e)
			if err != nil {
				enc[i].err = fmt.Errorf("outbox: encode message %s: %w", e.UUID, err)
				break
			}
			enc[i].vals = append(enc[i].vals, v)
			enc[i].bytes += int64(len(v))
		}
		if enc[i].err != nil {
			continue
		}
		n := len(enc[i].vals)
		if entries+n > s.maxEntries || bytes+enc[i].bytes > s.maxBytes {
			enc[i].err = fmt.Errorf("outbox: %d message(s) of %d bytes do not fit beside %d of %d bytes (limits %d, %d bytes): %w",
				n, enc[i].bytes, entries, bytes, s.maxEntries, s.maxBytes, ErrFull)
			continue
		}
		entries += n
		bytes += enc[i].bytes
		accepted++
	}
	var err error
	if accepted > 0 {
		err = s.db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketPending)
			for i := range batch {
				if enc[i].err != nil {
					continue
				}
				for _, v := range enc[i].vals {
					seq, err := b.NextSequence()
					if err != nil {
						return err
					}
					if err := b.Put(seqKey(seq), v); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	if err == nil {
		// Deltas, not the totals computed above: the forwarder removes entries meanwhile.
		s.mu.Lock()
		for i := range batch {
			if enc[i].err == nil {
				s.entries += len(enc[i].vals)
				s.bytes += enc[i].bytes
			}
		}
		s.mu.Unlock()
	}
	for i, req := range batch {
		switch {
		case enc[i].err != nil:
			req.result <- enc[i].err
		case err != nil:
			req.result <- fmt.Errorf("outbox: write %d message(s): %w", len(req.entries), err)
		default:
			req.result <- nil
		}
	}
}

// Peek returns up to n pending entries, oldest first, without removing them.
func (s *Store) Peek(n int) ([]Entry, error) {
	var out []Entry
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketPending).Cursor()
		for k, v := c.First(); k != nil && len(out) < n; k, v = c.Next() {
			var e Entry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("decode entry %d: %w", binary.BigEndian.Uint64(k), err)
			}
			e.Seq = binary.BigEndian.Uint64(k)
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: read pending entries: %w", err)
	}
	return out, nil
}

// Remove deletes the pending entries with the given sequence numbers, durably.
func (s *Store) Remove(seqs ...uint64) error {
	return s.move(nil, "", seqs...)
}

// Reject moves the pending entries with the given sequence numbers to the rejected set,
// with reason: they are kept for an operator, and no longer block the ones behind them.
func (s *Store) Reject(reason string, seqs ...uint64) error {
	return s.move(bucketRejected, reason, seqs...)
}

func (s *Store) move(to []byte, reason string, seqs ...uint64) error {
	var gone int
	var freed int64
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPending)
		for _, seq := range seqs {
			k := seqKey(seq)
			v := b.Get(k)
			if v == nil {
				continue
			}
			if to != nil {
				var e Entry
				if err := json.Unmarshal(v, &e); err != nil {
					return err
				}
				e.Reason = reason
				rv, err := json.Marshal(e)
				if err != nil {
					return err
				}
				if err := tx.Bucket(to).Put(k, rv); err != nil {
					return err
				}
			}
			gone++
			freed += int64(len(v))
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("outbox: remove %d entries: %w", len(seqs), err)
	}
	s.mu.Lock()
	s.entries -= gone
	s.bytes -= freed
	s.mu.Unlock()
	return nil
}

// Rejected returns the entries set aside by Reject, oldest first.
func (s *Store) Rejected() ([]Entry, error) {
	var out []Entry
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRejected).ForEach(func(k, v []byte) error {
			var e Entry
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			e.Seq = binary.BigEndian.Uint64(k)
			out = append(out, e)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: read rejected entries: %w", err)
	}
	return out, nil
}

// Close stops the writer (queued appends fail with ErrClosed) and closes the file.
func (s *Store) Close() error {
	var err error
	s.once.Do(func() {
		close(s.closing)
		<-s.done
		err = s.db.Close()
	})
	if errors.Is(err, bolterrors.ErrDatabaseNotOpen) {
		return nil
	}
	return err
}

func seqKey(seq uint64) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint64(k, seq)
	return k
}
