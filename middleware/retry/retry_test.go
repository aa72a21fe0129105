package retry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/internal/testkit/steptest"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/middleware/retry"
)

const (
	// queueName and handlerName are what the watermill router puts in the message context.
	queueName   = "orders"
	handlerName = "orders-handler"
)

var (
	errBoom   = errors.New("boom")
	errBroker = errors.New("broker unreachable")
	// now is the step's clock in every test.
	now = time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC)
)

// gatewayErr is a domain error naming its own type, as handlers return them.
type gatewayErr struct{ msg string }

func (e *gatewayErr) Error() string     { return e.msg }
func (e *gatewayErr) ErrorType() string { return "gateway_timeout" }

// delayCall is one call of fakeDelayer.Delay.
type delayCall struct {
	ctx   context.Context
	queue string
	d     time.Duration
	msg   *message.Message
}

// fakeDelayer records the hand-offs the step makes and fails them with err.
type fakeDelayer struct {
	err   error
	calls steptest.Log[delayCall]
}

func (f *fakeDelayer) Delay(ctx context.Context, queue string, d time.Duration, msg *message.Message) error {
	f.calls.Add(delayCall{ctx: ctx, queue: queue, d: d, msg: msg})
	return f.err
}

func (f *fakeDelayer) Calls() []delayCall { return f.calls.All() }

// eventLog records OnRetry events.
type eventLog = steptest.Log[retry.Event]

// testPolicy is a deterministic policy: no jitter, so every delay is exact.
func testPolicy() retry.Config {
	return retry.Config{
		MaxRetries:   5,
		InitialDelay: 100 * time.Millisecond,
		Multiplier:   2,
		MaxDelay:     10 * time.Second,
		Jitter:       retry.NoJitter,
	}
}

// fakeDeadLetterer records the dead-letter copies the step publishes.
type fakeDeadLetterer struct {
	calls steptest.Log[*message.Message]
}

func (f *fakeDeadLetterer) DeadLetter(_ context.Context, _ string, msg *message.Message) error {
	f.calls.Add(msg)
	return nil
}

// Step-wide recorders of the test that runs (the tests are not parallel): the outcomes the
// step reports and the messages it dead-letters, with their reasons.
var (
	observed *steptest.Observer
	dead     *fakeDeadLetterer
	deadErrs *steptest.Log[deadLetter]
)

// deadLetter is what an observer learns of one dead letter.
type deadLetter struct {
	Queue, MessageID, ErrorType string
	Retries                     int
	Err                         error
}

// newRetry is retry.New with a DeadLetterer of its own when cfg names none.
func newRetry(cfg retry.Config) (*retry.Retry, error) {
	if cfg.DeadLetterer == nil {
		cfg.DeadLetterer = &fakeDeadLetterer{}
	}
	return retry.New(cfg)
}

// newStep builds the retry step on cfg with the fixed clock, a silent logger, a fake
// Delayer failing with delayErr, an OnRetry recorder, an Observer and a poison step with a
// recording DeadLetterer.
func newStep(t *testing.T, cfg retry.Config, delayErr error) (*retry.Retry, *fakeDelayer, *eventLog) {
	t.Helper()
	d := &fakeDelayer{err: delayErr}
	events := &eventLog{}
	observed, dead, deadErrs = &steptest.Observer{}, &fakeDeadLetterer{}, &steptest.Log[deadLetter]{}
	cfg.DeadLetterer = dead
	cfg.Observer = disposition.Observers{observed, disposition.ObserverFunc(func(_ context.Context, o disposition.Outcome) {
		if o.Disposition.Kind == disposition.DeadLetter {
			deadErrs.Add(deadLetter{Queue: o.Queue, MessageID: o.MessageID, ErrorType: o.ErrorType, Retries: o.Attempt - 1, Err: o.Disposition.Reason})
		}
	})}
	cfg.Delayer = d
	cfg.Now = func() time.Time { return now }
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.OnRetry = events.Add
	r, err := newRetry(cfg)
	require.NoError(t, err)
	return r, d, events
}

// result is what one message did through the step.
type result struct {
	msg      *message.Message // the message the step received
	before   message.Metadata // its metadata before the step ran
	out      []*message.Message
	err      error
	report   steptest.Report
	reported bool
	// dead is the reason of the message's dead letter, nil when it was not dead-lettered.
	dead error
	// settlement is how the subscriber settles the message when the step nacks it.
	settlement broker.Settlement
}

// run sends a message with md through mw around h inside a real watermill router, as the
// stack's router runs the step (see internal/testkit/steptest).
func run(t *testing.T, mw message.HandlerMiddleware, h message.HandlerFunc, md message.Metadata) result {
	t.Helper()
	r := steptest.Run(t, mw, h, steptest.Message{Queue: queueName, Handler: handlerName, Payload: []byte(`{"order":"o-1"}`), Metadata: md})
	res := result{msg: r.Msg, before: r.Before, out: r.Out, err: r.Err, settlement: r.Settlement}
	if observed != nil {
		res.report, res.reported = observed.Last()
	}
	if dead != nil && len(dead.calls.All()) > 0 {
		evs := deadErrs.All()
		res.dead = evs[len(evs)-1].Err
	}
	return res
}

// failing returns a handler failing with err.
func failing(err error) message.HandlerFunc {
	return func(*message.Message) ([]*message.Message, error) { return nil, err }
}

// historyOf returns an x-retry-history of failed attempts 1..n.
func historyOf(n int) string {
	var md message.Metadata = message.Metadata{}
	for i := 1; i <= n; i++ {
		md.Set(sluice.HeaderRetryHistory, failure.AppendHistory(md, failure.HistoryEntry{
			At: now.Add(time.Duration(i-n-1) * time.Minute), Attempt: i, Type: "error", Message: "earlier failure",
		}))
	}
	return md.Get(sluice.HeaderRetryHistory)
}

func attempts(entries []failure.HistoryEntry) []int {
	out := make([]int, len(entries))
	for i, e := range entries {
		out[i] = e.Attempt
	}
	return out
}

func TestNew_Defaults(t *testing.T) {
	r, err := newRetry(retry.Config{Delayer: &fakeDelayer{}})
	require.NoError(t, err)
	cfg := r.Config()
	assert.Equal(t, 5, cfg.MaxRetries)
	assert.Equal(t, time.Second, cfg.InitialDelay)
	assert.Equal(t, 2.0, cfg.Multiplier)
	assert.Equal(t, time.Minute, cfg.MaxDelay)
	assert.Equal(t, 0.1, cfg.Jitter)
	assert.Equal(t, 24*time.Hour, cfg.MaxTotalAge)
	assert.Equal(t, 24*time.Hour, cfg.MaxRetryAfter)
	assert.NotNil(t, cfg.Logger)
	require.NotNil(t, cfg.Now)
	assert.WithinDuration(t, time.Now(), cfg.Now(), time.Minute)
}

func TestNew_Validation(t *testing.T) {
	d := &fakeDelayer{}
	tests := []struct {
		name    string
		cfg     retry.Config
		wantIs  error  // sentinel, or nil
		wantMsg string // substring naming the setting and value; empty: valid
		check   func(t *testing.T, cfg retry.Config)
	}{
		{name: "no Delayer", cfg: retry.Config{}, wantIs: retry.ErrNoDelayer},
		{name: "Multiplier below 1", cfg: retry.Config{Delayer: d, Multiplier: 0.5}, wantMsg: "Multiplier 0.5"},
		{name: "negative Multiplier", cfg: retry.Config{Delayer: d, Multiplier: -2}, wantMsg: "Multiplier -2"},
		{name: "Multiplier 1 is a constant backoff", cfg: retry.Config{Delayer: d, Multiplier: 1}, check: func(t *testing.T, cfg retry.Config) {
			assert.Equal(t, 1.0, cfg.Multiplier)
		}},
		{name: "MaxDelay below InitialDelay", cfg: retry.Config{Delayer: d, InitialDelay: 5 * time.Second, MaxDelay: time.Second}, wantMsg: "MaxDelay 1s is shorter than InitialDelay 5s"},
		{name: "InitialDelay above the default MaxDelay", cfg: retry.Config{Delayer: d, InitialDelay: 2 * time.Minute}, wantMsg: "MaxDelay 1m0s"},
		{name: "MaxDelay equal to InitialDelay", cfg: retry.Config{Delayer: d, InitialDelay: time.Second, MaxDelay: time.Second}, check: func(t *testing.T, cfg retry.Config) {
			assert.Equal(t, time.Second, cfg.MaxDelay)
		}},
		{name: "Jitter 1", cfg: retry.Config{Delayer: d, Jitter: 1}, wantMsg: "Jitter 1"},
		{name: "Jitter above 1", cfg: retry.Config{Delayer: d, Jitter: 1.5}, wantMsg: "Jitter 1.5"},
		{name: "Jitter just below 1", cfg: retry.Config{Delayer: d, Jitter: 0.99}, check: func(t *testing.T, cfg retry.Config) {
			assert.Equal(t, 0.99, cfg.Jitter)
		}},
		{name: "negative Jitter means none", cfg: retry.Config{Delayer: d, Jitter: -0.5}, check: func(t *testing.T, cfg retry.Config) {
			assert.Zero(t, cfg.Jitter)
		}},
		{name: "NoJitter means none", cfg: retry.Config{Delayer: d, Jitter: retry.NoJitter}, check: func(t *testing.T, cfg retry.Config) {
			assert.Zero(t, cfg.Jitter)
		}},
		{name: "negative MaxRetries means none", cfg: retry.Config{Delayer: d, MaxRetries: -1}, check: func(t *testing.T, cfg retry.Config) {
			assert.Zero(t, cfg.MaxRetries)
		}},
		{name: "negative durations mean the defaults", cfg: retry.Config{Delayer: d, InitialDelay: -1, MaxDelay: -1, MaxTotalAge: -1, MaxRetryAfter: -1}, check: func(t *testing.T, cfg retry.Config) {
			assert.Equal(t, time.Second, cfg.InitialDelay)
			assert.Equal(t, time.Minute, cfg.MaxDelay)
			assert.Equal(t, 24*time.Hour, cfg.MaxTotalAge)
			assert.Equal(t, 24*time.Hour, cfg.MaxRetryAfter)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := newRetry(tt.cfg)
			switch {
			case tt.wantIs != nil:
				require.ErrorIs(t, err, tt.wantIs)
				assert.Nil(t, r)
			case tt.wantMsg != "":
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantMsg)
				assert.Nil(t, r)
			default:
				require.NoError(t, err)
				tt.check(t, r.Config())
			}
		})
	}
}

func TestBackoff_WithoutJitter(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name   string
		cfg    retry.Config
		delays []time.Duration // Backoff(1), Backoff(2), ...
	}{
		{
			name:   "doubling, capped",
			cfg:    retry.Config{InitialDelay: 100 * ms, Multiplier: 2, MaxDelay: time.Second},
			delays: []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second, time.Second},
		},
		{
			name:   "multiplier 1.5",
			cfg:    retry.Config{InitialDelay: 100 * ms, Multiplier: 1.5, MaxDelay: time.Minute},
			delays: []time.Duration{100 * ms, 150 * ms, 225 * ms, 337500 * time.Microsecond},
		},
		{
			name:   "constant",
			cfg:    retry.Config{InitialDelay: 250 * ms, Multiplier: 1, MaxDelay: time.Second},
			delays: []time.Duration{250 * ms, 250 * ms, 250 * ms},
		},
		{
			name:   "defaults",
			cfg:    retry.Config{},
			delays: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute},
		},
		{
			name:   "initial equals max",
			cfg:    retry.Config{InitialDelay: time.Second, Multiplier: 3, MaxDelay: time.Second},
			delays: []time.Duration{time.Second, time.Second},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Delayer = &fakeDelayer{}
			tt.cfg.Jitter = retry.NoJitter
			r, err := newRetry(tt.cfg)
			require.NoError(t, err)
			for i, want := range tt.delays {
				assert.Equal(t, want, r.Backoff(i+1), "Backoff(%d)", i+1)
			}
		})
	}
}

func TestBackoff_WithJitter(t *testing.T) {
	const samples = 200
	tests := []struct {
		name   string
		jitter float64
	}{
		{"default jitter", 0},
		{"half", 0.5},
		{"small", 0.05},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := newRetry(retry.Config{Delayer: &fakeDelayer{}, InitialDelay: 100 * time.Millisecond, Multiplier: 2, MaxDelay: time.Second, Jitter: tt.jitter})
			require.NoError(t, err)
			j := r.Config().Jitter
			for n, base := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
				base *= time.Millisecond
				lo := time.Duration(float64(base) * (1 - j))
				hi := time.Duration(float64(base) * (1 + j))
				seen := map[time.Duration]bool{}
				for range samples {
					d := r.Backoff(n + 1)
					require.GreaterOrEqual(t, d, lo, "Backoff(%d) below %s-%v", n+1, base, j)
					require.LessOrEqual(t, d, hi+1, "Backoff(%d) above %s+%v", n+1, base, j) // +1ns: the library's rounding
					seen[d] = true
				}
				assert.Greater(t, len(seen), 1, "Backoff(%d) is not randomized", n+1)
			}
		})
	}
}

func TestMiddleware_SuccessPassesThrough(t *testing.T) {
	r, d, events := newStep(t, testPolicy(), nil)
	outputs := []*message.Message{message.NewMessage("out-1", []byte("a")), message.NewMessage("out-2", []byte("b"))}
	res := run(t, r.Middleware, func(*message.Message) ([]*message.Message, error) { return outputs, nil }, nil)
	require.NoError(t, res.err)
	assert.Equal(t, outputs, res.out)
	assert.Empty(t, d.Calls())
	assert.Empty(t, events.All())
	assert.False(t, res.reported, "a success is reported by telemetry as an ack, not by retry")
	assert.Equal(t, res.before, res.msg.Metadata, "the original is unchanged")
}

func TestMiddleware_RetryHandsOffADelayedCopy(t *testing.T) {
	earlier := now.Add(-time.Hour)
	tests := []struct {
		name         string
		cfg          func(*retry.Config)
		md           message.Metadata
		wantCount    string
		wantDelay    time.Duration
		wantFirst    time.Time
		wantOrigin   string
		wantHistory  []int
		wantAttempt  int
		wantCopyMore message.Metadata // other headers the copy must carry
	}{
		{
			name:      "first failure",
			md:        message.Metadata{},
			wantCount: "1", wantDelay: 100 * time.Millisecond, wantFirst: now,
			wantOrigin: queueName, wantHistory: []int{1}, wantAttempt: 1,
		},
		{
			name: "third failure keeps sluice's first failure time and history",
			md: message.Metadata{
				sluice.HeaderRetryCount:    "2",
				headers.TripAttempts:       "2",
				headers.FirstFailureTime:   failure.FormatTime(earlier),
				sluice.HeaderOriginalQueue: queueName,
				sluice.HeaderRetryHistory:  historyOf(2),
			},
			wantCount: "3", wantDelay: 400 * time.Millisecond, wantFirst: earlier,
			wantOrigin: queueName, wantHistory: []int{1, 2, 3}, wantAttempt: 3,
			wantCopyMore: message.Metadata{headers.TripAttempts: "3"},
		},
		{
			// Issue 33: a producer's retry state steers nothing and is kept apart.
			name: "a producer's origin, retry count, first failure time and history",
			md: message.Metadata{
				sluice.HeaderRetryCount:    "2",
				headers.FirstFailureTime:   failure.FormatTime(earlier),
				sluice.HeaderOriginalQueue: "victim.q",
				sluice.HeaderRetryHistory:  historyOf(2),
			},
			wantCount: "3", wantDelay: 400 * time.Millisecond, wantFirst: now,
			wantOrigin: queueName, wantHistory: []int{3}, wantAttempt: 3,
			wantCopyMore: message.Metadata{
				headers.ProducerOriginalQueue:    "victim.q",
				headers.ProducerFirstFailureTime: failure.FormatTime(earlier),
				headers.ProducerRetryHistory:     historyOf(2),
				headers.ArrivedRetryCount:        "2",
				headers.TripAttempts:             "1",
			},
		},
		{
			name:      "garbage first failure time is replaced",
			md:        message.Metadata{sluice.HeaderRetryCount: "1", headers.FirstFailureTime: "yesterday"},
			wantCount: "2", wantDelay: 200 * time.Millisecond, wantFirst: now,
			wantOrigin: queueName, wantHistory: []int{2}, wantAttempt: 2,
		},
		{
			name:      "future first failure time is replaced",
			md:        message.Metadata{sluice.HeaderRetryCount: "1", headers.FirstFailureTime: failure.FormatTime(now.Add(time.Hour))},
			wantCount: "2", wantDelay: 200 * time.Millisecond, wantFirst: now,
			wantOrigin: queueName, wantHistory: []int{2}, wantAttempt: 2,
		},
		{
			name:      "garbage count counts as 0",
			md:        message.Metadata{sluice.HeaderRetryCount: "lots"},
			wantCount: "1", wantDelay: 100 * time.Millisecond, wantFirst: now,
			wantOrigin: queueName, wantHistory: []int{1}, wantAttempt: 1,
		},
		{
			name:      "negative count counts as 0",
			md:        message.Metadata{sluice.HeaderRetryCount: "-4"},
			wantCount: "1", wantDelay: 100 * time.Millisecond, wantFirst: now,
			wantOrigin: queueName, wantHistory: []int{1}, wantAttempt: 1,
		},
		{
			name:      "count with spaces is normalized",
			md:        message.Metadata{sluice.HeaderRetryCount: " 2 "},
			wantCount: "3", wantDelay: 400 * time.Millisecond, wantFirst: now,
			wantOrigin: queueName, wantHistory: []int{3}, wantAttempt: 3,
		},
		{
			name:      "history at its bound drops the oldest",
			cfg:       func(c *retry.Config) { c.MaxRetries = 10 },
			md:        message.Metadata{sluice.HeaderRetryCount: "5", headers.TripAttempts: "5", sluice.HeaderRetryHistory: historyOf(5)},
			wantCount: "6", wantDelay: 3200 * time.Millisecond, wantFirst: now,
			wantOrigin: queueName, wantHistory: []int{2, 3, 4, 5, 6}, wantAttempt: 6,
		},
		{
			name:      "garbage history restarts",
			md:        message.Metadata{sluice.HeaderRetryCount: "1", sluice.HeaderRetryHistory: "[{not json"},
			wantCount: "2", wantDelay: 200 * time.Millisecond, wantFirst: now,
			wantOrigin: queueName, wantHistory: []int{2}, wantAttempt: 2,
		},
		{
			name:      "backoff capped at MaxDelay",
			cfg:       func(c *retry.Config) { c.MaxRetries = 10 },
			md:        message.Metadata{sluice.HeaderRetryCount: "8"},
			wantCount: "9", wantDelay: 10 * time.Second, wantFirst: now,
			wantOrigin: queueName, wantHistory: []int{9}, wantAttempt: 9,
		},
		{
			name:      "other metadata travels with the copy",
			md:        message.Metadata{"tenant": "t-9", headers.TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
			wantCount: "1", wantDelay: 100 * time.Millisecond, wantFirst: now,
			wantOrigin: queueName, wantHistory: []int{1}, wantAttempt: 1,
			wantCopyMore: message.Metadata{"tenant": "t-9", headers.TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testPolicy()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			r, d, events := newStep(t, cfg, nil)
			herr := fmt.Errorf("charge order: %w", &gatewayErr{msg: "gateway did not answer"})
			res := run(t, r.Middleware, failing(herr), tt.md)

			require.NoError(t, res.err, "a confirmed hand-off acks the original")
			assert.Nil(t, res.out)
			calls := d.Calls()
			require.Len(t, calls, 1, "one hand-off")
			call := calls[0]
			assert.Equal(t, queueName, call.queue, "delayed back to the queue it came from")
			assert.Equal(t, tt.wantDelay, call.d)
			assert.Equal(t, res.msg.Context(), call.ctx, "the hand-off runs with the attempt's context")

			c := call.msg
			require.NotSame(t, res.msg, c)
			assert.Equal(t, res.msg.UUID, c.UUID)
			assert.Equal(t, []byte(`{"order":"o-1"}`), []byte(c.Payload))
			md := c.Metadata
			assert.Equal(t, tt.wantCount, md.Get(sluice.HeaderRetryCount))
			assert.Equal(t, failure.FormatTime(tt.wantFirst), md.Get(headers.FirstFailureTime))
			assert.Equal(t, failure.FormatTime(now), md.Get(headers.LastFailureTime))
			assert.Equal(t, "gateway_timeout", md.Get(sluice.HeaderLastError))
			assert.Equal(t, "charge order: gateway did not answer", md.Get(sluice.HeaderLastErrorMessage))
			assert.Equal(t, tt.wantOrigin, md.Get(sluice.HeaderOriginalQueue))
			history := failure.History(md)
			assert.Equal(t, tt.wantHistory, attempts(history))
			if assert.NotEmpty(t, history) {
				last := history[len(history)-1]
				assert.True(t, now.Equal(last.At))
				assert.Equal(t, "gateway_timeout", last.Type)
				assert.Equal(t, "charge order: gateway did not answer", last.Message)
			}
			for k, v := range tt.wantCopyMore {
				assert.Equal(t, v, md.Get(k), "header %s", k)
			}

			assert.Equal(t, res.before, res.msg.Metadata, "the original message's metadata was changed")

			assert.True(t, res.reported)
			assert.Equal(t, steptest.Report{Outcome: disposition.Retry, Delay: tt.wantDelay, Attempt: tt.wantAttempt, Err: herr}, res.report)
			assert.Equal(t, []retry.Event{{
				Queue: queueName, MessageID: res.msg.UUID, Attempt: tt.wantAttempt, Delay: tt.wantDelay, Err: herr,
			}}, events.All())
		})
	}
}

func TestMiddleware_LastErrorHeaders(t *testing.T) {
	long := strings.Repeat("é", failure.MaxErrorMessageBytes) // twice the limit in bytes
	tests := []struct {
		name     string
		err      error
		wantType string
		wantMsg  string
	}{
		{"plain error", errBoom, "error", "boom"},
		{"typed error", &gatewayErr{msg: "slow"}, "gateway_timeout", "slow"},
		{"custom struct type", &customErr{}, "retry_test.customErr", "custom"},
		{"panic is its value", recoveredPanic(), "panic", "panic: card store is nil"},
		{"untyped error names its Go type", fmt.Errorf("charge: %w", &net.OpError{Op: "dial", Net: "tcp", Err: errBoom}), "net.OpError", "charge: dial tcp: boom"},
		{"RetryAfter keeps the type", sluice.RetryAfter(time.Second, &gatewayErr{msg: "429"}), "gateway_timeout", "retry after 1s: 429"},
		{"long message is truncated", errors.New(long), "error", failure.Truncate(long, failure.MaxErrorMessageBytes)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, d, _ := newStep(t, testPolicy(), nil)
			res := run(t, r.Middleware, failing(tt.err), nil)
			require.NoError(t, res.err)
			require.Len(t, d.Calls(), 1)
			md := d.Calls()[0].msg.Metadata
			assert.Equal(t, tt.wantType, md.Get(sluice.HeaderLastError))
			assert.Equal(t, tt.wantMsg, md.Get(sluice.HeaderLastErrorMessage))
			assert.LessOrEqual(t, len(md.Get(sluice.HeaderLastErrorMessage)), failure.MaxErrorMessageBytes)
			assert.LessOrEqual(t, len(md.Get(sluice.HeaderRetryHistory)), 1024, "the history keeps a short message")
			history := failure.History(md)
			require.NotEmpty(t, history)
			assert.Equal(t, tt.wantType, history[len(history)-1].Type)
			assert.Equal(t, failure.Truncate(tt.wantMsg, failure.MaxHistoryMessageBytes), history[len(history)-1].Message)
			for k, v := range md {
				assert.NotContains(t, v, "goroutine", "no stack in %s", k)
			}
		})
	}
}

// recoveredPanic returns the error Watermill's Recoverer makes of a panic, stack included.
func recoveredPanic() error {
	_, err := middleware.Recoverer(func(*message.Message) ([]*message.Message, error) {
		panic(errors.New("card store is nil"))
	})(message.NewMessage("m-panic", nil))
	return err
}

// Issue 17: a panic's stack was in every log line. The retry log names the panic's value.
func TestMiddleware_LogLineHoldsNoStack(t *testing.T) {
	var buf testenv.SyncBuffer
	cfg := testPolicy()
	cfg.Delayer = &fakeDelayer{}
	cfg.Now = func() time.Time { return now }
	cfg.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := newRetry(cfg)
	require.NoError(t, err)
	res := run(t, r.Middleware, failing(recoveredPanic()), nil)
	require.NoError(t, res.err)
	assert.Contains(t, buf.String(), `error="panic: card store is nil"`)
	assert.NotContains(t, buf.String(), "goroutine")
}

type customErr struct{}

func (*customErr) Error() string { return "custom" }

func TestMiddleware_RetryAfter(t *testing.T) {
	tests := []struct {
		name      string
		cfg       func(*retry.Config)
		err       error
		count     string
		wantDelay time.Duration
	}{
		{name: "exact wait", err: sluice.RetryAfter(3*time.Second, errBoom), wantDelay: 3 * time.Second},
		{name: "exact wait, not the backoff, on a later retry", err: sluice.RetryAfter(1500*time.Millisecond, errBoom), count: "3", wantDelay: 1500 * time.Millisecond},
		{name: "wait shorter than the backoff", err: sluice.RetryAfter(time.Millisecond, errBoom), count: "4", wantDelay: time.Millisecond},
		{name: "wrapped", err: fmt.Errorf("gateway: %w", sluice.RetryAfter(2*time.Second, errBoom)), wantDelay: 2 * time.Second},
		{name: "capped at MaxRetryAfter", cfg: func(c *retry.Config) { c.MaxRetryAfter = time.Hour }, err: sluice.RetryAfter(48*time.Hour, errBoom), wantDelay: time.Hour},
		{name: "capped at the default MaxRetryAfter", err: sluice.RetryAfter(30*time.Hour, errBoom), wantDelay: 24 * time.Hour},
		{name: "zero wait uses the backoff", err: sluice.RetryAfter(0, errBoom), count: "1", wantDelay: 200 * time.Millisecond},
		{name: "negative wait uses the backoff", err: sluice.RetryAfter(-time.Second, errBoom), count: "2", wantDelay: 400 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testPolicy()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			r, d, _ := newStep(t, cfg, nil)
			res := run(t, r.Middleware, failing(tt.err), message.Metadata{sluice.HeaderRetryCount: tt.count})
			require.NoError(t, res.err)
			calls := d.Calls()
			require.Len(t, calls, 1)
			assert.Equal(t, tt.wantDelay, calls[0].d)
			assert.Equal(t, strconv.Itoa(sluice.RetryCount(res.msg.Metadata)+1), calls[0].msg.Metadata.Get(sluice.HeaderRetryCount), "RetryAfter uses an attempt")
			assert.Equal(t, tt.wantDelay, res.report.Delay)
		})
	}
}

// Errors the step does not retry are dead-lettered at once, acked (Discard), or given back
// (an inner step's GiveBack), with no retry hand-off.
func TestMiddleware_NotRetried(t *testing.T) {
	permanent := sluice.Permanent(errBoom)
	wrappedPermanent := fmt.Errorf("validate: %w", sluice.Permanent(errBoom))
	permanentRetryAfter := sluice.Permanent(sluice.RetryAfter(time.Second, errBoom))
	discard := sluice.Discard(errBoom)
	unprocessed := markers.ReturnUnprocessed(errBroker)
	tests := []struct {
		name       string
		err        error
		count      string
		wantErr    error // the error given back (nacked); nil: acked
		wantDead   error // the dead letter's reason; nil: none
		wantReport *steptest.Report
	}{
		{name: "Permanent", err: permanent, wantDead: permanent, wantReport: &steptest.Report{Outcome: disposition.DeadLetter, Attempt: 1, Err: permanent}},
		{name: "Permanent wrapped", err: wrappedPermanent, wantDead: wrappedPermanent, wantReport: &steptest.Report{Outcome: disposition.DeadLetter, Attempt: 1, Err: wrappedPermanent}},
		{name: "Permanent around RetryAfter", err: permanentRetryAfter, wantDead: permanentRetryAfter, wantReport: &steptest.Report{Outcome: disposition.DeadLetter, Attempt: 1, Err: permanentRetryAfter}},
		{name: "Discard", err: discard, count: "2", wantReport: &steptest.Report{Outcome: disposition.Discard, Attempt: 3, Err: discard}},
		{name: "returned unprocessed from below", err: unprocessed, wantErr: errBroker, wantReport: &steptest.Report{Outcome: disposition.GiveBack, Attempt: 1, Err: errBroker}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, d, events := newStep(t, testPolicy(), nil)
			res := run(t, r.Middleware, failing(tt.err), message.Metadata{sluice.HeaderRetryCount: tt.count})
			if tt.wantErr != nil {
				assert.True(t, isGiveBack(res.err), "given back: %v", res.err)
				assert.ErrorIs(t, res.err, tt.wantErr)
			} else {
				assert.NoError(t, res.err)
			}
			if tt.wantDead != nil {
				assert.Same(t, tt.wantDead, res.dead)
			} else {
				assert.NoError(t, res.dead)
			}
			assert.Nil(t, res.out)
			assert.Empty(t, d.Calls(), "no hand-off")
			assert.Empty(t, events.All())
			assert.Equal(t, res.before, res.msg.Metadata, "the original is unchanged")
			if tt.wantErr != nil {
				assert.Equal(t, broker.SettleReturn, res.settlement, "returned unprocessed: at once, not counted as a failed delivery")
			}
			if tt.wantReport != nil {
				assert.True(t, res.reported)
				assert.Equal(t, *tt.wantReport, res.report)
			} else {
				assert.False(t, res.reported, "reported %+v", res.report)
			}
		})
	}
}

func TestMiddleware_Exhausted(t *testing.T) {
	tests := []struct {
		name          string
		cfg           func(*retry.Config)
		md            message.Metadata
		err           error
		wantExhausted bool
		wantRetries   int
		wantAge       time.Duration
	}{
		{name: "last retry left", cfg: func(c *retry.Config) { c.MaxRetries = 3 }, md: message.Metadata{sluice.HeaderRetryCount: "2"}},
		{name: "retries used up", cfg: func(c *retry.Config) { c.MaxRetries = 3 }, md: message.Metadata{sluice.HeaderRetryCount: "3"}, wantExhausted: true, wantRetries: 3},
		{name: "count above MaxRetries", cfg: func(c *retry.Config) { c.MaxRetries = 3 }, md: message.Metadata{sluice.HeaderRetryCount: "7"}, wantExhausted: true, wantRetries: 7},
		{name: "huge count", md: message.Metadata{sluice.HeaderRetryCount: strings.Repeat("9", 30)}, wantExhausted: true, wantRetries: sluice.MaxRetryCountHeader},
		{name: "count beyond int64", md: message.Metadata{sluice.HeaderRetryCount: "9223372036854775808"}, wantExhausted: true, wantRetries: sluice.MaxRetryCountHeader},
		{name: "negative MaxRetries: the first failure is final", cfg: func(c *retry.Config) { c.MaxRetries = -1 }, md: message.Metadata{}, wantExhausted: true, wantRetries: 0},
		{name: "RetryAfter does not add retries", cfg: func(c *retry.Config) { c.MaxRetries = 2 }, md: message.Metadata{sluice.HeaderRetryCount: "2"}, err: sluice.RetryAfter(time.Second, errBoom), wantExhausted: true, wantRetries: 2},
		{
			name:          "older than MaxTotalAge",
			md:            message.Metadata{sluice.HeaderRetryCount: "1", headers.TripAttempts: "1", headers.FirstFailureTime: failure.FormatTime(now.Add(-25 * time.Hour))},
			wantExhausted: true, wantRetries: 1, wantAge: 25 * time.Hour,
		},
		{
			name: "a producer's first failure time does not age the message",
			md:   message.Metadata{sluice.HeaderRetryCount: "1", headers.FirstFailureTime: failure.FormatTime(now.Add(-25 * time.Hour))},
		},
		{
			name: "a replay starts the age over",
			md: message.Metadata{headers.ReplayedAt: failure.FormatTime(now.Add(-time.Minute)),
				headers.FirstFailureTime: failure.FormatTime(now.Add(-25 * time.Hour))},
		},
		{
			name: "exactly MaxTotalAge old",
			md:   message.Metadata{sluice.HeaderRetryCount: "1", headers.FirstFailureTime: failure.FormatTime(now.Add(-24 * time.Hour))},
		},
		{
			name:          "older than a custom MaxTotalAge",
			cfg:           func(c *retry.Config) { c.MaxTotalAge = time.Hour },
			md:            message.Metadata{sluice.HeaderRetryCount: "2", headers.TripAttempts: "2", headers.FirstFailureTime: failure.FormatTime(now.Add(-61 * time.Minute))},
			wantExhausted: true, wantRetries: 2, wantAge: 61 * time.Minute,
		},
		{
			name: "garbage first failure time does not age the message",
			cfg:  func(c *retry.Config) { c.MaxTotalAge = time.Hour },
			md:   message.Metadata{sluice.HeaderRetryCount: "2", headers.FirstFailureTime: "1970-01-01"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testPolicy()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			r, d, events := newStep(t, cfg, nil)
			herr := tt.err
			if herr == nil {
				herr = errBoom
			}
			res := run(t, r.Middleware, failing(herr), tt.md)
			if !tt.wantExhausted {
				require.NoError(t, res.err)
				assert.Len(t, d.Calls(), 1, "retried")
				return
			}
			require.NoError(t, res.err, "dead-lettered, then acked")
			require.Error(t, res.dead)
			assert.ErrorIs(t, res.dead, disposition.ErrRetriesExhausted)
			assert.ErrorIs(t, res.dead, errBoom, "the handler's error stays reachable")
			var ee *decide.ExhaustedError
			require.ErrorAs(t, res.dead, &ee)
			assert.Same(t, herr, ee.Err)
			assert.Same(t, herr, errors.Unwrap(res.dead))
			assert.Equal(t, tt.wantRetries, ee.Retries)
			assert.Equal(t, tt.wantAge, ee.Age)
			assert.Empty(t, d.Calls(), "no hand-off once exhausted")
			assert.Empty(t, events.All())
			assert.Equal(t, res.before, res.msg.Metadata, "the original is unchanged")
		})
	}
}

func TestMiddleware_Defer(t *testing.T) {
	firstDefer := now.Add(-10 * time.Minute)
	reason := errors.New("breaker open")
	tests := []struct {
		name           string
		md             message.Metadata
		err            error
		wantDelay      time.Duration
		wantDeferCount string
		wantFirstDefer time.Time
		wantAttempt    int
	}{
		{
			name: "first deferral", md: message.Metadata{}, err: sluice.Defer(5*time.Second, reason),
			wantDelay: 5 * time.Second, wantDeferCount: "1", wantFirstDefer: now, wantAttempt: 1,
		},
		{
			name: "after two retries the count is unchanged",
			md:   message.Metadata{sluice.HeaderRetryCount: "2", headers.FirstFailureTime: failure.FormatTime(now.Add(-time.Minute))},
			err:  sluice.Defer(time.Second, reason), wantDelay: time.Second, wantDeferCount: "1", wantFirstDefer: now, wantAttempt: 3,
		},
		{
			name: "a later deferral keeps the first deferral time",
			md:   message.Metadata{headers.DeferCount: "3", headers.FirstDeferTime: failure.FormatTime(firstDefer)},
			err:  sluice.Defer(time.Second, reason), wantDelay: time.Second, wantDeferCount: "4", wantFirstDefer: firstDefer, wantAttempt: 1,
		},
		{
			name: "garbage defer count restarts",
			md:   message.Metadata{headers.DeferCount: "many"},
			err:  sluice.Defer(time.Second, reason), wantDelay: time.Second, wantDeferCount: "1", wantFirstDefer: now, wantAttempt: 1,
		},
		{
			name: "negative defer count restarts",
			md:   message.Metadata{headers.DeferCount: "-7"},
			err:  sluice.Defer(time.Second, reason), wantDelay: time.Second, wantDeferCount: "1", wantFirstDefer: now, wantAttempt: 1,
		},
		{
			name: "garbage first deferral time is replaced",
			md:   message.Metadata{headers.DeferCount: "1", headers.FirstDeferTime: "soon"},
			err:  sluice.Defer(time.Second, reason), wantDelay: time.Second, wantDeferCount: "2", wantFirstDefer: now, wantAttempt: 1,
		},
		{
			name: "negative delay is no delay", md: message.Metadata{}, err: sluice.Defer(-time.Second, reason),
			wantDelay: 0, wantDeferCount: "1", wantFirstDefer: now, wantAttempt: 1,
		},
		{
			name: "wrapped Defer", md: message.Metadata{}, err: fmt.Errorf("idempotency: %w", sluice.Defer(700*time.Millisecond, nil)),
			wantDelay: 700 * time.Millisecond, wantDeferCount: "1", wantFirstDefer: now, wantAttempt: 1,
		},
		{
			name: "beyond MaxRetries a deferral is still no attempt",
			md:   message.Metadata{sluice.HeaderRetryCount: "5"},
			err:  sluice.Defer(time.Second, reason), wantDelay: time.Second, wantDeferCount: "1", wantFirstDefer: now, wantAttempt: 6,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, d, events := newStep(t, testPolicy(), nil)
			res := run(t, r.Middleware, failing(tt.err), tt.md)
			require.NoError(t, res.err)
			calls := d.Calls()
			require.Len(t, calls, 1)
			call := calls[0]
			assert.Equal(t, queueName, call.queue)
			assert.Equal(t, tt.wantDelay, call.d)
			assert.Equal(t, res.msg.UUID, call.msg.UUID)
			assert.Equal(t, res.msg.Payload, call.msg.Payload)

			md := call.msg.Metadata
			assert.Equal(t, res.msg.Metadata.Get(sluice.HeaderRetryCount), md.Get(sluice.HeaderRetryCount), "a deferral uses no attempt")
			assert.Equal(t, res.msg.Metadata.Get(sluice.HeaderRetryHistory), md.Get(sluice.HeaderRetryHistory), "a deferral is not a failure")
			assert.Equal(t, res.msg.Metadata.Get(headers.FirstFailureTime), md.Get(headers.FirstFailureTime))
			assert.Equal(t, tt.wantDeferCount, md.Get(headers.DeferCount))
			assert.Equal(t, failure.FormatTime(tt.wantFirstDefer), md.Get(headers.FirstDeferTime))
			assert.Equal(t, queueName, md.Get(sluice.HeaderOriginalQueue))
			assert.Equal(t, res.before, res.msg.Metadata, "the original message's metadata was changed")

			assert.Equal(t, steptest.Report{Outcome: disposition.Defer, Delay: tt.wantDelay, Attempt: tt.wantAttempt, Err: tt.err}, res.report)
			assert.Equal(t, []retry.Event{{
				Queue: queueName, MessageID: res.msg.UUID, Attempt: tt.wantAttempt, Delay: tt.wantDelay, Deferred: true, Err: tt.err,
			}}, events.All())
		})
	}
}

// A huge x-defer-count from a producer must not wrap around to a negative count.
func TestMiddleware_DeferCountDoesNotOverflow(t *testing.T) {
	r, d, _ := newStep(t, testPolicy(), nil)
	res := run(t, r.Middleware, failing(sluice.Defer(time.Second, nil)), message.Metadata{headers.DeferCount: strconv.Itoa(int(^uint(0) >> 1))})
	require.NoError(t, res.err)
	require.Len(t, d.Calls(), 1)
	n, err := strconv.Atoi(d.Calls()[0].msg.Metadata.Get(headers.DeferCount))
	require.NoError(t, err)
	assert.Positive(t, n)
}

func TestMiddleware_DeferExpires(t *testing.T) {
	reason := errors.New("key in flight")
	tests := []struct {
		name        string
		cfg         func(*retry.Config)
		md          message.Metadata
		wantExpired bool
	}{
		{name: "deferred for longer than MaxTotalAge", md: message.Metadata{headers.FirstDeferTime: failure.FormatTime(now.Add(-25 * time.Hour))}, wantExpired: true},
		{name: "deferred for exactly MaxTotalAge", md: message.Metadata{headers.FirstDeferTime: failure.FormatTime(now.Add(-24 * time.Hour))}},
		{
			name:        "first failure older than MaxTotalAge",
			md:          message.Metadata{headers.FirstFailureTime: failure.FormatTime(now.Add(-25 * time.Hour)), headers.FirstDeferTime: failure.FormatTime(now.Add(-time.Minute))},
			wantExpired: true,
		},
		{
			name:        "custom MaxTotalAge",
			cfg:         func(c *retry.Config) { c.MaxTotalAge = time.Hour },
			md:          message.Metadata{headers.FirstDeferTime: failure.FormatTime(now.Add(-2 * time.Hour))},
			wantExpired: true,
		},
		{
			name: "a future first deferral time does not expire it",
			cfg:  func(c *retry.Config) { c.MaxTotalAge = time.Hour },
			md:   message.Metadata{headers.FirstDeferTime: failure.FormatTime(now.Add(48 * time.Hour))},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testPolicy()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			r, d, events := newStep(t, cfg, nil)
			res := run(t, r.Middleware, failing(sluice.Defer(time.Second, reason)), tt.md)
			if !tt.wantExpired {
				require.NoError(t, res.err)
				assert.Len(t, d.Calls(), 1, "deferred")
				return
			}
			require.NoError(t, res.err, "dead-lettered, then acked")
			require.Error(t, res.dead)
			assert.ErrorIs(t, res.dead, disposition.ErrDeferralExpired)
			assert.ErrorIs(t, res.dead, reason)
			assert.Equal(t, sluice.ClassPermanent, sluice.ClassOf(res.dead), "an expired deferral goes to the dead-letter queue: %v", res.dead)
			assert.Empty(t, d.Calls())
			assert.Empty(t, events.All())
		})
	}
}

func TestMiddleware_HandoffFails(t *testing.T) {
	tests := []struct {
		name        string
		err         error
		md          message.Metadata
		wantAttempt int
	}{
		{name: "retry", err: errBoom, md: message.Metadata{sluice.HeaderRetryCount: "1"}, wantAttempt: 2},
		{name: "RetryAfter", err: sluice.RetryAfter(time.Second, errBoom), wantAttempt: 1},
		{name: "deferral", err: sluice.Defer(time.Second, errBoom), md: message.Metadata{sluice.HeaderRetryCount: "3"}, wantAttempt: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, d, events := newStep(t, testPolicy(), errBroker)
			res := run(t, r.Middleware, failing(tt.err), tt.md)
			require.Error(t, res.err)
			assert.True(t, isGiveBack(res.err), "the original must be nacked, got %v", res.err)
			assert.ErrorIs(t, res.err, errBroker)
			assert.NotErrorIs(t, res.err, disposition.ErrRetriesExhausted)
			assert.NotEqual(t, sluice.ClassPermanent, sluice.ClassOf(res.err), "a failed hand-off must not be dead-lettered")
			assert.Contains(t, res.err.Error(), res.msg.UUID)
			assert.Contains(t, res.err.Error(), strconv.Quote(queueName))
			assert.Len(t, d.Calls(), 1)
			assert.Empty(t, events.All(), "OnRetry is for confirmed hand-offs")
			require.True(t, res.reported)
			assert.Equal(t, disposition.GiveBack, res.report.Outcome)
			assert.Equal(t, tt.wantAttempt, res.report.Attempt)
			assert.ErrorIs(t, res.report.Err, errBroker)
			assert.Equal(t, res.before, res.msg.Metadata, "the original is unchanged")
			assert.Equal(t, broker.SettleReject, res.settlement, "a failed hand-off is a failure: requeued after a pause, counted")
		})
	}
}

// With the step in a real router and the fake Delayer redelivering, the count climbs one
// per retry and the message is exhausted after exactly MaxRetries retries.
func TestMiddleware_CountsUpToExhaustion(t *testing.T) {
	cfg := testPolicy()
	cfg.MaxRetries = 3
	r, d, _ := newStep(t, cfg, nil)
	md := message.Metadata{}
	for i := 0; i < cfg.MaxRetries; i++ {
		res := run(t, r.Middleware, failing(errBoom), md)
		require.NoError(t, res.err, "retry %d", i+1)
		calls := d.Calls()
		md = calls[len(calls)-1].msg.CopyWithContext().Metadata
		assert.Equal(t, strconv.Itoa(i+1), md.Get(sluice.HeaderRetryCount))
	}
	res := run(t, r.Middleware, failing(errBoom), md)
	require.NoError(t, res.err)
	assert.ErrorIs(t, res.dead, disposition.ErrRetriesExhausted)
	assert.Len(t, d.Calls(), cfg.MaxRetries)
	assert.Equal(t, []int{1, 2, 3}, attempts(failure.History(md)))
}

func TestMiddleware_DeferIsCappedAtMaxRetryAfter(t *testing.T) {
	cfg := testPolicy()
	cfg.MaxRetryAfter = time.Hour
	r, d, _ := newStep(t, cfg, nil)
	res := run(t, r.Middleware, failing(sluice.Defer(30*24*time.Hour, errors.New("breaker open for a month"))), nil)
	require.NoError(t, res.err)
	calls := d.Calls()
	require.Len(t, calls, 1)
	assert.Equal(t, time.Hour, calls[0].d, "a deferral longer than MaxRetryAfter is capped")
}

// Issue 33: a retry count the message arrived with is named as such, not as retries made.
func TestMiddleware_ExhaustedNamesAnArrivedRetryCount(t *testing.T) {
	tests := []struct {
		name string
		md   message.Metadata
		want string
	}{
		{name: "forged by a producer", md: message.Metadata{sluice.HeaderRetryCount: "99"},
			want: "retries exhausted: arrived with x-retry-count 99; 1 attempt made here: boom"},
		{name: "huge, clamped", md: message.Metadata{sluice.HeaderRetryCount: strings.Repeat("9", 30)},
			want: "retries exhausted: arrived with x-retry-count 1000000; 1 attempt made here: boom"},
		{name: "part arrived, part made here", md: message.Metadata{sluice.HeaderRetryCount: "3", headers.ArrivedRetryCount: "2", headers.TripAttempts: "1"},
			want: "retries exhausted: arrived with x-retry-count 2; 2 attempts made here: boom"},
		{name: "all made here", md: message.Metadata{sluice.HeaderRetryCount: "3", headers.TripAttempts: "3"},
			want: "retries exhausted after 3 retries: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testPolicy()
			cfg.MaxRetries = 3
			r, _, _ := newStep(t, cfg, nil)
			res := run(t, r.Middleware, failing(errors.New("boom")), tt.md)
			require.NoError(t, res.err)
			require.ErrorIs(t, res.dead, disposition.ErrRetriesExhausted)
			assert.Equal(t, tt.want, res.dead.Error())
		})
	}
}

// isGiveBack reports whether err has the subscriber give the message back unacked.
func isGiveBack(err error) bool {
	_, ok := errors.AsType[*carry.GiveBack](err)
	return ok
}
