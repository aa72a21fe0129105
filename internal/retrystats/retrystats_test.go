package retrystats_test

import (
	"context"

	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/retrystats"
)

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newStats(t testing.TB, cfg retrystats.Config) (*retrystats.Stats, *clock) {
	t.Helper()
	c := &clock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	cfg.Now = c.Now
	s, err := retrystats.New(cfg)
	require.NoError(t, err)
	return s, c
}

// typedErr is an error with a declared type.
type typedErr string

func (e typedErr) Error() string     { return string(e) }
func (e typedErr) ErrorType() string { return string(e) }

// journey plays one message's attempts through s as the retry step reports them: each
// step is the attempt's error (nil: success) and its disposition's kind.
type step struct {
	err  error
	kind disposition.Kind
}

func journey(s *retrystats.Stats, handler string, steps ...step) {
	prev := ""
	for i, st := range steps {
		o := disposition.Outcome{Handler: handler, Attempt: i + 1, RetriedErrorType: prev, Disposition: disposition.Disposition{Kind: st.kind, Reason: st.err}}
		if st.err != nil {
			o.ErrorType = sluice.ErrorType(st.err)
		}
		if i == 0 {
			o.RetriedErrorType = ""
		}
		s.Observe(context.Background(), o)
		if st.kind == disposition.Retry {
			prev = o.ErrorType
		}
	}
}

var (
	errTimeout  = typedErr("timeout")
	errUpstream = typedErr("upstream")
	errBad      = typedErr("bad_record")
)

func retry(err error) step { return step{err, disposition.Retry} }
func ok() step             { return step{nil, disposition.Ack} }
func exhausted(err error, retries int) step {
	return step{&decide.ExhaustedError{Retries: retries, Err: err}, disposition.DeadLetter}
}

// The counts match a ledger of what the test sent.
func TestStats_MatchLedger(t *testing.T) {
	tests := []struct {
		name     string
		journeys [][]step
		errType  string
		want     retrystats.TypeStats
	}{
		{
			name:     "recovered at attempt 2 and 3",
			journeys: [][]step{{retry(errTimeout), ok()}, {retry(errTimeout), retry(errTimeout), ok()}},
			errType:  "timeout",
			want:     retrystats.TypeStats{Messages: 2, Retries: 3, Recovered: 2, Ended: 2, RecoveredAt: [16]int64{1, 1}},
		},
		{
			name: "exhausted after 2 retries",
			journeys: [][]step{
				{retry(errUpstream), retry(errUpstream), exhausted(errUpstream, 2)},
				{retry(errUpstream), retry(errUpstream), exhausted(errUpstream, 2)},
			},
			errType: "upstream",
			want:    retrystats.TypeStats{Messages: 2, Retries: 4, Exhausted: 2, Ended: 2},
		},
		{
			name:     "permanent at once is a message but no evidence",
			journeys: [][]step{{{sluice.Permanent(errBad), disposition.DeadLetter}}},
			errType:  "bad_record",
			want:     retrystats.TypeStats{Messages: 1, Permanent: 1},
		},
		{
			name:     "made permanent after a retry is evidence",
			journeys: [][]step{{retry(errBad), {sluice.Permanent(errBad), disposition.DeadLetter}}},
			errType:  "bad_record",
			want:     retrystats.TypeStats{Messages: 1, Retries: 1, Permanent: 1, Ended: 1},
		},
		{
			name:     "discarded after a retry",
			journeys: [][]step{{retry(errBad), {sluice.Discard(errBad), disposition.Discard}}},
			errType:  "bad_record",
			want:     retrystats.TypeStats{Messages: 1, Retries: 1, Discarded: 1, Ended: 1},
		},
		{
			name:     "still in flight",
			journeys: [][]step{{retry(errTimeout)}, {retry(errTimeout), retry(errTimeout)}, {retry(errTimeout), ok()}},
			errType:  "timeout",
			want:     retrystats.TypeStats{Messages: 3, Retries: 4, InFlight: 2, Recovered: 1, Ended: 1, RecoveredAt: [16]int64{1}},
		},
		{
			name: "the learned policy's dead letters are not evidence",
			journeys: [][]step{{{&decide.UnlikelyError{Err: errUpstream}, disposition.DeadLetter}},
				{retry(errUpstream), {&decide.UnlikelyError{Err: errUpstream}, disposition.DeadLetter}}},
			errType: "upstream",
			want:    retrystats.TypeStats{Messages: 2, Retries: 1, Unlikely: 2},
		},
		{
			name:     "a recovery counts under the type it recovered from",
			journeys: [][]step{{retry(errUpstream), retry(errTimeout), ok()}},
			errType:  "timeout",
			want:     retrystats.TypeStats{Messages: 1, Retries: 1, Recovered: 1, Ended: 1, RecoveredAt: [16]int64{0, 1}},
		},
		{
			name:     "a type whose run ended in another type's retry",
			journeys: [][]step{{retry(errUpstream), retry(errTimeout), ok()}},
			errType:  "upstream",
			want:     retrystats.TypeStats{Messages: 1, Retries: 1},
		},
		{
			name:     "a first attempt's success is not counted",
			journeys: [][]step{{ok()}, {ok()}},
			errType:  "",
			want:     retrystats.TypeStats{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := newStats(t, retrystats.Config{})
			for _, j := range tt.journeys {
				journey(s, "pay", j...)
			}
			got := s.Type("pay", tt.errType)
			tt.want.Handler, tt.want.ErrorType, tt.want.Window = "pay", tt.errType, time.Hour
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestStats_RecoveryFigures(t *testing.T) {
	s, _ := newStats(t, retrystats.Config{})
	// 9 of 10 recover at attempt 2, one at attempt 4; 10 more exhaust.
	for range 9 {
		journey(s, "pay", retry(errTimeout), ok())
	}
	journey(s, "pay", retry(errTimeout), retry(errTimeout), retry(errTimeout), ok())
	for range 10 {
		journey(s, "pay", retry(errTimeout), exhausted(errTimeout, 1))
	}
	ts := s.Type("pay", "timeout")
	assert.InDelta(t, 0.5, ts.RecoveryRate(), 1e-9)
	assert.Equal(t, 2, ts.RecoveryAttempt(0.5), "median")
	assert.Equal(t, 4, ts.RecoveryAttempt(0.99))
	assert.Equal(t, decide.Evidence{ErrorType: "timeout", Recovered: 10, Ended: 20, Window: time.Hour}, ts.Evidence())
	assert.Equal(t, "10 of 20 recovered in the last hour", ts.Evidence().String())
	assert.Zero(t, s.Type("pay", "upstream").RecoveryAttempt(0.5), "nothing recovered")
}

// Counts leave the window a tenth at a time.
func TestStats_SlidingWindow(t *testing.T) {
	s, c := newStats(t, retrystats.Config{Window: 10 * time.Minute})
	journey(s, "pay", retry(errUpstream), exhausted(errUpstream, 1))
	c.Add(5 * time.Minute)
	journey(s, "pay", retry(errUpstream), exhausted(errUpstream, 1))
	assert.EqualValues(t, 2, s.Type("pay", "upstream").Ended)
	c.Add(5*time.Minute + time.Second)
	assert.EqualValues(t, 1, s.Type("pay", "upstream").Ended, "the first left the window")
	c.Add(5 * time.Minute)
	assert.EqualValues(t, 0, s.Type("pay", "upstream").Ended, "both left")
	c.Add(time.Hour)
	journey(s, "pay", retry(errUpstream), exhausted(errUpstream, 1))
	assert.EqualValues(t, 1, s.Type("pay", "upstream").Ended, "counting again after a long gap")
}

// Under 10,000 distinct error types, a handler tracks MaxTypes of them and counts the
// rest as _OTHER; memory stays bounded.
func TestStats_BoundedTypes(t *testing.T) {
	s, _ := newStats(t, retrystats.Config{MaxTypes: 8})
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range 10_000 {
		e := typedErr(fmt.Sprintf("type-%d", i))
		journey(s, "pay", retry(e), exhausted(e, 1))
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	snap := s.Snapshot()
	require.Len(t, snap, 9, "8 types and _OTHER")
	var other retrystats.TypeStats
	for _, ts := range snap {
		if ts.ErrorType == retrystats.OtherType {
			other = ts
		}
	}
	assert.EqualValues(t, 10_000-8, other.Messages)
	assert.EqualValues(t, 10_000-8, other.Ended)
	assert.Equal(t, other.Ended, s.Type("pay", "type-9999").Ended, "an untracked type reads _OTHER")
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	assert.Less(t, grown, int64(9*(retrystats.BytesPerType+512)), "heap grew by %d bytes", grown)
}

func TestConfig_Validate(t *testing.T) {
	tests := []struct {
		name string
		cfg  retrystats.Config
		want string
	}{
		{name: "zero is the defaults"},
		{name: "window too short", cfg: retrystats.Config{Window: time.Millisecond}, want: "Window 1ms"},
		{name: "negative types", cfg: retrystats.Config{MaxTypes: -1}, want: "MaxTypes -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				require.NoError(t, err)
				assert.Equal(t, time.Hour, tt.cfg.Window)
				assert.Equal(t, 32, tt.cfg.MaxTypes)
				return
			}
			require.ErrorIs(t, err, retrystats.ErrInvalidConfig)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

// The success path of a message that never failed allocates nothing.
func TestObserve_FirstSuccessAllocatesNothing(t *testing.T) {
	s, _ := newStats(t, retrystats.Config{})
	o := disposition.Outcome{Handler: "pay", Attempt: 1, Disposition: disposition.Disposition{Kind: disposition.Ack}}
	ctx := context.Background()
	assert.Zero(t, testing.AllocsPerRun(1000, func() { s.Observe(ctx, o) }))
	assert.Empty(t, s.Snapshot())
}

func BenchmarkObserve(b *testing.B) {
	ctx := context.Background()
	cases := []struct {
		name string
		o    disposition.Outcome
	}{
		{"first_attempt_success", disposition.Outcome{Handler: "pay", Attempt: 1, Disposition: disposition.Disposition{Kind: disposition.Ack}}},
		{"retry", disposition.Outcome{Handler: "pay", Attempt: 1, ErrorType: "timeout", Disposition: disposition.Disposition{Kind: disposition.Retry, Reason: errTimeout}}},
		{"recovery", disposition.Outcome{Handler: "pay", Attempt: 2, RetriedErrorType: "timeout", Disposition: disposition.Disposition{Kind: disposition.Ack}}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			s, _ := newStats(b, retrystats.Config{})
			b.ReportAllocs()
			for b.Loop() {
				s.Observe(ctx, c.o)
			}
		})
	}
}

// BenchmarkStateBytesPerType measures what one more tracked error type costs: counters,
// map entry and name.
func BenchmarkStateBytesPerType(b *testing.B) {
	const types = 1000
	var grown int64
	for b.Loop() {
		s, _ := newStats(b, retrystats.Config{MaxTypes: types})
		names := make([]error, types)
		for i := range names {
			names[i] = typedErr(fmt.Sprintf("type-%04d", i))
		}
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for _, e := range names {
			journey(s, "pay", retry(e))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		grown = int64(after.HeapAlloc) - int64(before.HeapAlloc)
		runtime.KeepAlive(s)
	}
	b.ReportMetric(float64(grown)/types, "bytes/type")
	b.ReportMetric(float64(retrystats.BytesPerType), "counter-bytes/type")
}
