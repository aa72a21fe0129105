package dlq

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/internal/dlqwire"
)

// Inspector reads dead-letter queues without consuming them (see the package doc). It is a
// plain value: dlq.Inspector{Conn: conn} reads Q.dlq.
type Inspector struct {
	// Conn is the RabbitMQ connection reads open their channels on. Required; the caller
	// owns it.
	Conn *amqp.Connection
	// Now is the clock ages are measured against. Nil means time.Now.
	Now func() time.Time
	// From is the queue read: Q.dlq (the zero value) or Q.dlq.archive.
	From Source
	// Window is how many messages a read has in flight. Zero means 2,000.
	Window int
	// Progress, when set, is called as a read goes (see Progress).
	Progress func(Progress)
}

// Show returns the records of every message of queue's DLQ whose id is id, head first,
// or an error matching ErrMessageNotFound. Two dead letters can share an id (a producer
// that reuses ids, or a message dead-lettered again after a replay while its first copy is
// still there): each record's SameID then names the others' positions, and the first is
// the oldest.
func (i Inspector) Show(ctx context.Context, queue, id string) ([]Record, error) {
	var found []Record
	// Only a message with the id is decoded whole: the read goes through the whole DLQ.
	decode := func(d amqp.Delivery, queue string, pos int, now time.Time) Record {
		if dlqwire.MessageID(d) != id {
			return Record{}
		}
		return newRecord(d, queue, pos, now)
	}
	_, err := i.scanWith(ctx, queue, decode, func(r Record) bool {
		if r.ID == id && id != "" {
			found = append(found, r)
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("message %q in %q: %w", id, i.From.name(queue), ErrMessageNotFound)
	}
	if len(found) > 1 {
		for k := range found {
			for j, other := range found {
				if j != k {
					found[k].SameID = append(found[k].SameID, other.Position)
				}
			}
		}
	}
	return found, nil
}

// Stats summarizes a DLQ.
type Stats struct {
	Queue string `json:"queue"`
	DLQ   string `json:"dlq"`
	// Total is the number of messages counted.
	Total int `json:"total"`
	// Oldest is the largest age among them (zero when none has a known age).
	Oldest time.Duration `json:"-"`
	// ByErrorType counts them by error type, most frequent first.
	ByErrorType []typeStats `json:"by_error_type"`
}

// typeStats counts the messages of one error type.
type typeStats struct {
	ErrorType string `json:"error_type"`
	Count     int    `json:"count"`
	// Oldest is the largest age among them.
	Oldest time.Duration `json:"-"`
}

// MarshalJSON writes Oldest as oldest_age_seconds.
func (s Stats) MarshalJSON() ([]byte, error) {
	type plain Stats
	return json.Marshal(struct {
		plain
		OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	}{plain(s), s.Oldest.Seconds()})
}

// MarshalJSON writes Oldest as oldest_age_seconds.
func (t typeStats) MarshalJSON() ([]byte, error) {
	type plain typeStats
	return json.Marshal(struct {
		plain
		OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	}{plain(t), t.Oldest.Seconds()})
}

// Stats reads every message of queue's DLQ and counts them by error type. A message
// without an error type counts under "".
func (i Inspector) Stats(ctx context.Context, queue string) (Stats, error) {
	s := Stats{Queue: queue, DLQ: i.From.name(queue), ByErrorType: []typeStats{}}
	byType := map[string]*typeStats{}
	_, err := i.scanWith(ctx, queue, selectionRecord, func(r Record) bool {
		s.Total++
		ts := byType[r.ErrorType]
		if ts == nil {
			ts = &typeStats{ErrorType: r.ErrorType}
			byType[r.ErrorType] = ts
		}
		ts.Count++
		if r.HasAge {
			ts.Oldest = max(ts.Oldest, r.Age)
			s.Oldest = max(s.Oldest, r.Age)
		}
		return true
	})
	if err != nil {
		return Stats{}, err
	}
	for _, ts := range byType {
		s.ByErrorType = append(s.ByErrorType, *ts)
	}
	sort.Slice(s.ByErrorType, func(a, b int) bool {
		x, y := s.ByErrorType[a], s.ByErrorType[b]
		if x.Count != y.Count {
			return x.Count > y.Count
		}
		return x.ErrorType < y.ErrorType
	})
	return s, nil
}

// Messages calls visit with each message of queue's DLQ (or archive) that sel matches,
// head first, until visit returns false (a limit: return false once you have enough), and
// returns the number of messages the queue held when the read started. A zero Selector
// matches every message. Records are not kept: memory stays flat however long the queue
// is.
func (i Inspector) Messages(ctx context.Context, queue string, sel Selector, visit func(Record) bool) (int, error) {
	return i.scan(ctx, queue, func(r Record) bool {
		if !sel.match(r) {
			return true
		}
		return visit(r)
	})
}

// scan reads queue's source from the head, acknowledging nothing, and calls visit for each
// record until visit returns false or the source has no ready message left. Once visit is
// done it still reads (without decoding) up to the number of messages the queue held at
// the start: on quorum queues RabbitMQ puts a returned message at the tail, so only giving
// back all of them, in order, keeps the order. Closing the channel gives every message
// back. It returns the number of ready messages the queue had at the start.
func (i Inspector) scan(ctx context.Context, queue string, visit func(Record) bool) (int, error) {
	return i.scanWith(ctx, queue, newRecord, visit)
}

// scanWith is scan with records made by decode (newRecord, or selectionRecord for the
// reads that need only the failure record's summary: Stats, Groups).
func (i Inspector) scanWith(ctx context.Context, queue string, decode func(amqp.Delivery, string, int, time.Time) Record, visit func(Record) bool) (int, error) {
	ch, total, err := openSource(i.Conn, queue, i.From)
	if err != nil {
		return 0, err
	}
	rd, err := newReader(i.Conn, ch, i.From.name(queue), total, i.Window, 0, nil)
	if err != nil {
		_ = ch.Close()
		return total, err
	}
	defer rd.close() // gives back everything read, in order
	prog := newProgressor(i.Progress, "read", i.From.name(queue), total)
	clock := now(i.Now)
	visiting := true
	for n := 1; ; n++ {
		d, _, ok, err := rd.next(ctx)
		if err != nil {
			return total, err
		}
		if !ok {
			break
		}
		rd.hold(d)
		if visiting {
			visiting = visit(decode(d, queue, n, clock))
		}
		prog.scanned(1, false)
	}
	prog.done()
	return total, nil
}

func now(clock func() time.Time) time.Time {
	if clock == nil {
		return time.Now()
	}
	return clock()
}
