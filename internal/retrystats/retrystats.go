// Package retrystats counts, per handler and error type, how the messages that failed
// ended: recovered (and at which attempt), dead-lettered after exhausting their retries,
// made permanent, discarded, dead-lettered by the learned retry policy, or still in
// flight, over a sliding window (one hour by default).
//
// Stats is a disposition.Observer: give it to the retry step (retry.Config.Stats, which
// the learned policy reads) or add it to any observer chain. Each attempt is counted by
// RetryEventOf: a message is counted under each error type it failed with,
// its end under the type of its last failure. A first attempt that succeeds costs one
// comparison and no allocation.
//
// Memory is bounded: at most Config.MaxTypes error types per handler are tracked, later
// ones are counted together as OtherType ("_OTHER"); each tracked type costs
// BytesPerType bytes of counters plus its map entry (measured by
// BenchmarkStateBytesPerType).
package retrystats

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
	"unsafe"

	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/decide"
)

// OtherType is the error type under which the types past Config.MaxTypes of a handler are
// counted: the semantic conventions' fallback value, as the metrics use.
const OtherType = "_OTHER"

// Buckets is how many buckets a window is cut into: counts age out a tenth of the window
// at a time instead of all at once.
const Buckets = 10

// AttemptBins is how many recovery attempts are told apart: attempts 2 to AttemptBins are
// counted each on its own, later ones together in the last bin (attempt AttemptBins+1).
const AttemptBins = 16

// ErrInvalidConfig matches the error New returns for an invalid Config.
var ErrInvalidConfig = errors.New("retrystats: invalid config")

// Config configures Stats. Zero values mean the defaults named on each field.
type Config struct {
	// Window is how far back the counts reach. Zero means 1h.
	Window time.Duration
	// MaxTypes is how many error types are tracked per handler; later ones are counted as
	// OtherType. Zero means 32 (as the metrics' error.type limit).
	MaxTypes int
	// Now is the clock. Nil means time.Now.
	Now func() time.Time
}

// Validate fills in the defaults and reports an invalid setting, naming its value.
func (c *Config) Validate() error {
	if c.Window == 0 {
		c.Window = time.Hour
	}
	if c.Window < Buckets*time.Millisecond {
		return fmt.Errorf("%w: Window %s is shorter than %s", ErrInvalidConfig, c.Window, Buckets*time.Millisecond)
	}
	if c.MaxTypes == 0 {
		c.MaxTypes = 32
	}
	if c.MaxTypes < 1 {
		return fmt.Errorf("%w: MaxTypes %d must be at least 1", ErrInvalidConfig, c.MaxTypes)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// counts are one bucket's counts of one error type. uint32 keeps a tracked type small: a
// bucket covers a tenth of the window, and four billion failures of one type in it would
// be a rate no broker delivers.
type counts struct {
	messages, retries, resolved                                   uint32
	recovered, exhausted, permanent, discarded, deadLettered, unl uint32
	ended                                                         uint32
	recoveredAt                                                   [AttemptBins]uint32
}

// series is the window of one error type: a ring of buckets; epoch is the bucket number
// (time since the Unix epoch over the bucket width) of ring[head].
type series struct {
	epoch int64
	head  int
	ring  [Buckets]counts
}

// BytesPerType is the size of one tracked error type's counters (its map entry and name
// come on top; BenchmarkStateBytesPerType measures the whole).
const BytesPerType = int(unsafe.Sizeof(series{}))

// advance moves s to bucket number epoch, clearing the buckets it leaves behind.
func (s *series) advance(epoch int64) {
	steps := epoch - s.epoch
	if steps <= 0 {
		return
	}
	if steps >= Buckets {
		s.ring = [Buckets]counts{}
		s.head = 0
		s.epoch = epoch
		return
	}
	for range steps {
		s.head = (s.head + 1) % Buckets
		s.ring[s.head] = counts{}
	}
	s.epoch = epoch
}

// handlerStats are the tracked types of one handler.
type handlerStats struct {
	types map[string]*series
}

// Stats counts retry outcomes. It is safe for concurrent use.
type Stats struct {
	cfg   Config
	width int64 // bucket width in nanoseconds

	mu       sync.Mutex
	handlers map[string]*handlerStats
}

// New returns Stats, or an error naming the invalid setting.
func New(cfg Config) (*Stats, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Stats{cfg: cfg, width: int64(cfg.Window / Buckets), handlers: map[string]*handlerStats{}}, nil
}

// Config returns the settings in force, defaults filled in.
func (s *Stats) Config() Config { return s.cfg }

// Observe counts o (disposition.Observer). A first attempt that succeeded returns at once.
func (s *Stats) Observe(_ context.Context, o disposition.Outcome) {
	if o.RetriedErrorType == "" && o.Disposition.Kind == disposition.Ack {
		return // the success path of a message that never failed
	}
	ev, ok := RetryEventOf(o)
	if !ok {
		return
	}
	s.Record(o.Handler, ev)
}

// Record counts ev for handler: what Observe does with an attempt's event.
func (s *Stats) Record(handler string, ev RetryEvent) {
	epoch := s.cfg.Now().UnixNano() / s.width
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.handlers[handler]
	if h == nil {
		h = &handlerStats{types: map[string]*series{}}
		s.handlers[handler] = h
	}
	if ev.Resolved != "" && ev.Resolved != ev.ErrorType {
		s.seriesOf(h, ev.Resolved, epoch).resolved++
	}
	c := s.seriesOf(h, ev.ErrorType, epoch)
	if ev.Resolved != "" && ev.Resolved == ev.ErrorType {
		c.resolved++
	}
	if ev.NewMessage {
		c.messages++
	}
	if ev.Retried {
		c.retries++
	}
	switch ev.End {
	case Recovered:
		c.recovered++
		c.recoveredAt[min(max(ev.Attempt, 2), AttemptBins+1)-2]++
	case Exhausted:
		c.exhausted++
	case MadePermanent:
		c.permanent++
	case Discarded:
		c.discarded++
	case DeadLettered:
		c.deadLettered++
	case Unlikely:
		c.unl++
	}
	if ev.Evidence() {
		c.ended++
	}
}

// seriesOf returns the current bucket of errType's series in h, tracking it while h has
// room, else OtherType's. Called with mu.
func (s *Stats) seriesOf(h *handlerStats, errType string, epoch int64) *counts {
	sr := h.types[errType]
	if sr == nil {
		if len(h.types) >= s.cfg.MaxTypes && errType != OtherType {
			errType = OtherType
			sr = h.types[OtherType]
		}
		if sr == nil {
			// OtherType may take one place past MaxTypes: the bound is MaxTypes+1.
			sr = &series{epoch: epoch}
			h.types[errType] = sr
		}
	}
	sr.advance(epoch)
	return &sr.ring[sr.head]
}

// TypeStats are the counts of one handler's error type over the window.
type TypeStats struct {
	Handler, ErrorType string
	// Window is the time the counts cover.
	Window time.Duration
	// Other is true when the type is not tracked and the counts are OtherType's.
	Other bool
	// Messages is how many messages failed with the type; Retries how many retries were
	// spent on it.
	Messages, Retries int64
	// InFlight is how many of those retries have not come back yet (retries scheduled
	// less attempts made after them in the window; never below zero, approximate at the
	// window's edge).
	InFlight int64
	// How the messages ended, under the type of their last failure.
	Recovered, Exhausted, Permanent, Discarded, DeadLettered, Unlikely int64
	// Ended is the evidence the learned policy reads: messages retried after failing with
	// the type whose retries ended (Recovered, or dead-lettered or discarded after a
	// retry), not counting the learned policy's own dead letters.
	Ended int64
	// RecoveredAt[i] is how many recovered at attempt i+2; the last element counts
	// attempt AttemptBins+1 and later.
	RecoveredAt [AttemptBins]int64
}

// RecoveryRate is Recovered over Ended, the share of retried messages that recovered;
// zero when none ended.
func (t TypeStats) RecoveryRate() float64 {
	if t.Ended == 0 {
		return 0
	}
	return float64(t.Recovered) / float64(t.Ended)
}

// RecoveryAttempt returns the attempt by which a share q (0 < q ≤ 1) of the recovered
// messages recovered (q = 0.5: the median), 0 when none recovered.
func (t TypeStats) RecoveryAttempt(q float64) int {
	var total int64
	for _, n := range t.RecoveredAt {
		total += n
	}
	if total == 0 {
		return 0
	}
	need := q * float64(total)
	var seen int64
	for i, n := range t.RecoveredAt {
		seen += n
		if float64(seen) >= need {
			return i + 2
		}
	}
	return AttemptBins + 1
}

// Evidence returns the counts as the learned policy's evidence.
func (t TypeStats) Evidence() decide.Evidence {
	return decide.Evidence{ErrorType: t.ErrorType, Recovered: t.Recovered, Ended: t.Ended, Window: t.Window}
}

// Type returns the counts of handler's errType over the window. An untracked type of a
// handler whose MaxTypes are taken reads OtherType's counts, under its own name.
func (s *Stats) Type(handler, errType string) TypeStats {
	epoch := s.cfg.Now().UnixNano() / s.width
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := TypeStats{Handler: handler, ErrorType: errType, Window: s.cfg.Window}
	h := s.handlers[handler]
	if h == nil {
		return ts
	}
	sr := h.types[errType]
	if sr == nil && len(h.types) >= s.cfg.MaxTypes {
		sr = h.types[OtherType]
		ts.Other = true
	}
	if sr != nil {
		sr.sum(epoch, &ts)
	}
	return ts
}

// Snapshot returns the counts of every tracked type, by handler then error type.
func (s *Stats) Snapshot() []TypeStats {
	epoch := s.cfg.Now().UnixNano() / s.width
	s.mu.Lock()
	var out []TypeStats
	for name, h := range s.handlers {
		for t, sr := range h.types {
			ts := TypeStats{Handler: name, ErrorType: t, Window: s.cfg.Window}
			sr.sum(epoch, &ts)
			out = append(out, ts)
		}
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Handler != out[j].Handler {
			return out[i].Handler < out[j].Handler
		}
		return out[i].ErrorType < out[j].ErrorType
	})
	return out
}

// sum adds the window's counts at epoch to ts. Called with the Stats' mu.
func (s *series) sum(epoch int64, ts *TypeStats) {
	s.advance(epoch)
	var resolved int64
	for i := range s.ring {
		c := &s.ring[i]
		ts.Messages += int64(c.messages)
		ts.Retries += int64(c.retries)
		resolved += int64(c.resolved)
		ts.Recovered += int64(c.recovered)
		ts.Exhausted += int64(c.exhausted)
		ts.Permanent += int64(c.permanent)
		ts.Discarded += int64(c.discarded)
		ts.DeadLettered += int64(c.deadLettered)
		ts.Unlikely += int64(c.unl)
		ts.Ended += int64(c.ended)
		for j, n := range c.recoveredAt {
			ts.RecoveredAt[j] += int64(n)
		}
	}
	ts.InFlight = max(ts.Retries-resolved, 0)
}
