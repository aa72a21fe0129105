package poison_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
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
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/poison"
)

const (
	// queueName and handlerName are what the watermill router puts in the message context.
	queueName   = "payments"
	handlerName = "charge"
	host        = "worker-7"
	payload     = `{"payment":"p-1","amount":1250}`
)

var (
	errDeclined = errors.New("card declined")
	errBroker   = errors.New("broker unreachable")
	// now is the step's clock in every test.
	now = time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC)
)

// declinedErr is a domain error naming its own type.
type declinedErr struct{ msg string }

func (e *declinedErr) Error() string     { return e.msg }
func (e *declinedErr) ErrorType() string { return "card_declined" }

// deadLetterCall is one call of fakeDeadLetterer.DeadLetter.
type deadLetterCall struct {
	ctx   context.Context
	queue string
	msg   *message.Message
}

// fakeDeadLetterer records dead-letter publishes and fails them with err.
type fakeDeadLetterer struct {
	err   error
	calls steptest.Log[deadLetterCall]
}

func (f *fakeDeadLetterer) DeadLetter(ctx context.Context, queue string, msg *message.Message) error {
	f.calls.Add(deadLetterCall{ctx: ctx, queue: queue, msg: msg})
	return f.err
}

func (f *fakeDeadLetterer) Calls() []deadLetterCall { return f.calls.All() }

// deadLetter is what an observer learns of one dead letter.
type deadLetter struct {
	Queue, MessageID, ErrorType string
	Retries                     int
	Err                         error
}

// eventLog records the dead letters the step reports to its observer.
type eventLog struct{ observed *steptest.Observer }

func (e *eventLog) All() []deadLetter {
	var out []deadLetter
	for _, o := range e.observed.All() {
		if o.Disposition.Kind == disposition.DeadLetter {
			out = append(out, deadLetter{Queue: o.Queue, MessageID: o.MessageID, ErrorType: o.ErrorType, Retries: o.Attempt - 1, Err: o.Disposition.Reason})
		}
	}
	return out
}

// observed records the outcomes the step of the running test reports (the tests are not
// parallel).
var observed *steptest.Observer

// newStep builds the dead-letter step with the fixed clock and host, a silent logger, a
// fake DeadLetterer failing with dlErr, and a recorder of its dead letters.
func newStep(t *testing.T, dlErr error) (message.HandlerMiddleware, *fakeDeadLetterer, *eventLog) {
	t.Helper()
	dl := &fakeDeadLetterer{err: dlErr}
	observed = &steptest.Observer{}
	mw, err := poison.Middleware(poison.Config{
		DeadLetterer: dl,
		Observer:     observed,
		Logger:       slog.New(slog.DiscardHandler),
		Now:          func() time.Time { return now },
		Host:         host,
	})
	require.NoError(t, err)
	return mw, dl, &eventLog{observed: observed}
}

// result is what one message did through the step.
type result struct {
	msg      *message.Message // the message the step received
	before   message.Metadata // its metadata before the step ran
	out      []*message.Message
	err      error
	report   steptest.Report
	reported bool
	// settlement is how the subscriber settles the message when the step nacks it.
	settlement broker.Settlement
}

// run sends a message with md through mw around h inside a real watermill router, as the
// stack's router runs the step (see internal/testkit/steptest).
func run(t *testing.T, mw message.HandlerMiddleware, h message.HandlerFunc, md message.Metadata) result {
	t.Helper()
	r := steptest.Run(t, mw, h, steptest.Message{Queue: queueName, Handler: handlerName, Payload: []byte(payload), Metadata: md})
	res := result{msg: r.Msg, before: r.Before, out: r.Out, err: r.Err, settlement: r.Settlement}
	if observed != nil {
		res.report, res.reported = observed.Last()
	}
	return res
}

// failing returns a handler failing with err.
func failing(err error) message.HandlerFunc {
	return func(*message.Message) ([]*message.Message, error) { return nil, err }
}

// panicking returns a handler, wrapped by Watermill's Recoverer as the stack wraps it,
// that panics depth frames deep.
func panicking(depth int) message.HandlerFunc {
	return middleware.Recoverer(func(*message.Message) ([]*message.Message, error) {
		stackOfLongFrameNamesThatMakesTheRecordedPanicStackGrowQuickly{}.recurseUntilTheHandlerPanicsWithANilMapInTheChargeStep(depth)
		return nil, nil
	})
}

// stackOfLongFrameNamesThatMakesTheRecordedPanicStackGrowQuickly has long names because
// the runtime prints at most 100 frames: only long frames outgrow MaxStackBytes.
type stackOfLongFrameNamesThatMakesTheRecordedPanicStackGrowQuickly struct{}

func (s stackOfLongFrameNamesThatMakesTheRecordedPanicStackGrowQuickly) recurseUntilTheHandlerPanicsWithANilMapInTheChargeStep(n int) {
	if n == 0 {
		chargeWithNilMap()
	}
	s.recurseUntilTheHandlerPanicsWithANilMapInTheChargeStep(n - 1)
}

func chargeWithNilMap() {
	var m map[string]int
	m["p-1"] = 1
}

func attempts(entries []failure.HistoryEntry) []int {
	out := make([]int, len(entries))
	for i, e := range entries {
		out[i] = e.Attempt
	}
	return out
}

// earlierHistory returns an x-retry-history of failed attempts 1..n.
func earlierHistory(n int) string {
	md := message.Metadata{}
	for i := 1; i <= n; i++ {
		md.Set(sluice.HeaderRetryHistory, failure.AppendHistory(md, failure.HistoryEntry{
			At: now.Add(time.Duration(i-n-1) * time.Minute), Attempt: i, Type: "card_declined", Message: "earlier",
		}))
	}
	return md.Get(sluice.HeaderRetryHistory)
}

func TestMiddleware_Defaults(t *testing.T) {
	_, err := poison.Middleware(poison.Config{})
	require.ErrorIs(t, err, poison.ErrNoDeadLetterer)

	dl := &fakeDeadLetterer{}
	p, err := poison.Middleware(poison.Config{DeadLetterer: dl, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	res := run(t, p, failing(errDeclined), nil)
	require.NoError(t, res.err)
	require.Len(t, dl.Calls(), 1)
	hostname, herr := os.Hostname()
	require.NoError(t, herr)
	rec := dl.Calls()[0].msg
	assert.Equal(t, hostname, rec.Metadata.Get(headers.FailedHost), "an empty Host means os.Hostname()")
	failedAt, ok := failure.Time(rec.Metadata, headers.FailedAt, time.Now())
	require.True(t, ok, "x-failed-at %q", rec.Metadata.Get(headers.FailedAt))
	assert.WithinDuration(t, time.Now(), failedAt, time.Minute, "a nil Now means time.Now")
}

func TestMiddleware_DeadLettersWithAFailureRecord(t *testing.T) {
	earlier := now.Add(-2 * time.Hour)
	longMsg := strings.Repeat("declined because ", 100)
	tests := []struct {
		name        string
		md          message.Metadata
		err         error
		wantType    string
		wantClass   string
		wantMsg     string
		wantCount   string
		wantFirst   time.Time
		wantOrigin  string
		wantHistory []int
		wantMore    message.Metadata // other headers the record must carry
	}{
		{
			name: "permanent on the first attempt", md: message.Metadata{},
			err:      sluice.Permanent(&declinedErr{msg: "card declined"}),
			wantType: "card_declined", wantClass: "permanent", wantMsg: "permanent: card declined",
			wantCount: "0", wantFirst: now, wantOrigin: queueName, wantHistory: []int{1},
		},
		{
			name: "exhausted after retries keeps what the retries recorded",
			md: message.Metadata{
				sluice.HeaderRetryCount:    "3",
				headers.TripAttempts:       "3",
				headers.FirstFailureTime:   failure.FormatTime(earlier),
				sluice.HeaderOriginalQueue: queueName,
				sluice.HeaderRetryHistory:  earlierHistory(3),
			},
			err:      fmt.Errorf("retries exhausted after 3 retries: %w", &declinedErr{msg: "gateway 503"}),
			wantType: "card_declined", wantClass: "retryable", wantMsg: "retries exhausted after 3 retries: gateway 503",
			wantCount: "3", wantFirst: earlier, wantOrigin: queueName, wantHistory: []int{1, 2, 3, 4},
			wantMore: message.Metadata{headers.TripAttempts: "4"},
		},
		{
			// Issue 33: the record says what sluice knows, and keeps what the producer said apart.
			name: "a producer's origin, retry count, first failure time and history",
			md: message.Metadata{
				sluice.HeaderRetryCount:    "99",
				headers.FirstFailureTime:   failure.FormatTime(earlier),
				sluice.HeaderOriginalQueue: "victim.q",
				sluice.HeaderRetryHistory:  earlierHistory(3),
				headers.FailedStage:        "forged",
			},
			err:      errDeclined,
			wantType: "error", wantClass: "retryable", wantMsg: "card declined",
			wantCount: "99", wantFirst: now, wantOrigin: queueName, wantHistory: []int{100},
			wantMore: message.Metadata{
				headers.ProducerOriginalQueue:    "victim.q",
				headers.ProducerFirstFailureTime: failure.FormatTime(earlier),
				headers.ProducerRetryHistory:     earlierHistory(3),
				headers.ArrivedRetryCount:        "99",
				headers.TripAttempts:             "1",
			},
		},
		{
			name:     "history at its bound drops the oldest",
			md:       message.Metadata{sluice.HeaderRetryCount: "5", headers.TripAttempts: "5", sluice.HeaderRetryHistory: earlierHistory(5)},
			err:      errDeclined,
			wantType: "error", wantClass: "retryable", wantMsg: "card declined",
			wantCount: "5", wantFirst: now, wantOrigin: queueName, wantHistory: []int{2, 3, 4, 5, 6},
		},
		{
			name:     "garbage counts and times are normalized",
			md:       message.Metadata{sluice.HeaderRetryCount: "lots", headers.FirstFailureTime: "yesterday"},
			err:      sluice.Permanent(errDeclined),
			wantType: "error", wantClass: "permanent", wantMsg: "permanent: card declined",
			wantCount: "0", wantFirst: now, wantOrigin: queueName, wantHistory: []int{1},
		},
		{
			name:     "long message is truncated",
			md:       message.Metadata{},
			err:      sluice.Permanent(errors.New(longMsg)),
			wantType: "error", wantClass: "permanent", wantMsg: failure.Truncate("permanent: "+longMsg, failure.MaxErrorMessageBytes),
			wantCount: "0", wantFirst: now, wantOrigin: queueName, wantHistory: []int{1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, dl, events := newStep(t, nil)
			tt.md["tenant"] = "t-1"
			tt.md[headers.TraceParent] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
			res := run(t, p, failing(tt.err), tt.md)

			require.NoError(t, res.err, "a confirmed dead letter acks the original")
			assert.Nil(t, res.out)
			calls := dl.Calls()
			require.Len(t, calls, 1)
			call := calls[0]
			assert.Equal(t, queueName, call.queue)
			assert.Equal(t, res.msg.Context(), call.ctx)
			rec := call.msg
			require.NotSame(t, res.msg, rec)
			assert.Equal(t, res.msg.UUID, rec.UUID)
			assert.Equal(t, payload, string(rec.Payload), "payload byte for byte")

			md := rec.Metadata
			assert.Equal(t, tt.wantType, md.Get(sluice.HeaderErrorType))
			assert.Equal(t, tt.wantClass, md.Get(headers.ErrorClass))
			assert.Equal(t, tt.wantMsg, md.Get(sluice.HeaderErrorMessage))
			assert.LessOrEqual(t, len(md.Get(sluice.HeaderErrorMessage)), failure.MaxErrorMessageBytes)
			assert.NotContains(t, md, sluice.HeaderErrorStack, "no stack for an error that is not a panic")
			assert.Equal(t, tt.wantOrigin, md.Get(sluice.HeaderOriginalQueue))
			assert.Equal(t, handlerName, md.Get(headers.Handler))
			assert.NotContains(t, md, headers.FailedStage, "the handler failed, no other stage")
			for k, v := range tt.wantMore {
				assert.Equal(t, v, md.Get(k), k)
			}
			assert.Equal(t, tt.wantCount, md.Get(sluice.HeaderRetryCount))
			assert.Equal(t, failure.FormatTime(tt.wantFirst), md.Get(headers.FirstFailureTime))
			assert.Equal(t, failure.FormatTime(now), md.Get(headers.LastFailureTime))
			assert.Equal(t, failure.FormatTime(now), md.Get(headers.FailedAt))
			assert.Equal(t, host, md.Get(headers.FailedHost))
			assert.Equal(t, strconv.Itoa(os.Getpid()), md.Get(headers.FailedPID))
			history := failure.History(md)
			assert.Equal(t, tt.wantHistory, attempts(history))
			if assert.NotEmpty(t, history) {
				last := history[len(history)-1]
				assert.True(t, now.Equal(last.At))
				assert.Equal(t, tt.wantType, last.Type)
				assert.Equal(t, failure.Truncate(tt.err.Error(), failure.MaxHistoryMessageBytes), last.Message)
			}
			assert.Equal(t, "t-1", md.Get("tenant"), "other metadata is kept")
			assert.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", md.Get(headers.TraceParent))

			assert.Equal(t, res.before, res.msg.Metadata, "the original message's metadata was changed")

			retries := sluice.RetryCount(res.msg.Metadata)
			require.True(t, res.reported)
			assert.Equal(t, steptest.Report{Outcome: disposition.DeadLetter, Attempt: retries + 1, Err: tt.err}, res.report)
			assert.Equal(t, []deadLetter{{
				Queue: queueName, MessageID: res.msg.UUID, ErrorType: tt.wantType, Retries: retries, Err: tt.err,
			}}, events.All())
		})
	}
}

func TestMiddleware_PanicRecord(t *testing.T) {
	tests := []struct {
		name          string
		depth         int
		wantTruncated bool
	}{
		{"shallow stack", 0, false},
		{"stack beyond MaxStackBytes", 400, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, dl, events := newStep(t, nil)
			res := run(t, p, panicking(tt.depth), nil)
			require.NoError(t, res.err)
			require.Len(t, dl.Calls(), 1)
			md := dl.Calls()[0].msg.Metadata
			assert.Equal(t, "panic", md.Get(sluice.HeaderErrorType))
			assert.Equal(t, "panic", md.Get(sluice.HeaderLastError))
			// Issue 17: the whole stack was in x-error-message and every history entry.
			const want = "panic: assignment to entry in nil map"
			assert.Equal(t, want, md.Get(sluice.HeaderErrorMessage))
			assert.Equal(t, want, md.Get(sluice.HeaderLastErrorMessage))
			history := failure.History(md)
			require.Len(t, history, 1)
			assert.Equal(t, failure.HistoryEntry{At: now, Attempt: 1, Type: "panic", Message: want}, history[0])
			for k, v := range md {
				if k != sluice.HeaderErrorStack {
					assert.NotContains(t, v, "goroutine", "the stack is only in x-error-stack, not in %s", k)
				}
			}

			stack := md.Get(sluice.HeaderErrorStack)
			require.NotEmpty(t, stack, "a panic's record carries its stack")
			assert.Contains(t, stack, "poison_test.chargeWithNilMap", "the stack names the function that panicked")
			assert.LessOrEqual(t, len(stack), poison.MaxStackBytes)
			assert.Equal(t, tt.wantTruncated, strings.HasSuffix(stack, "…"), "stack of %d bytes", len(stack))
			if tt.wantTruncated {
				assert.Greater(t, len(stack), poison.MaxStackBytes-8, "truncated to MaxStackBytes, not shorter")
			}
			assert.Equal(t, "panic", events.All()[0].ErrorType)
		})
	}
}

// Issue 17: a panic's stack was in every log line. The dead-letter log line names the
// panic's value; the stack is in the record only. (The step logs it at debug level; the
// telemetry step writes the operator's info line, rate-limited.)
func TestMiddleware_PanicLogLineHoldsNoStack(t *testing.T) {
	var buf testenv.SyncBuffer
	p, err := poison.Middleware(poison.Config{
		DeadLetterer: &fakeDeadLetterer{},
		Logger:       slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Now:          func() time.Time { return now },
		Host:         host,
	})
	require.NoError(t, err)
	res := run(t, p, panicking(0), nil)
	require.NoError(t, res.err)
	assert.Contains(t, buf.String(), `error_type=panic`)
	assert.Contains(t, buf.String(), `error="panic: assignment to entry in nil map"`)
	assert.NotContains(t, buf.String(), "goroutine")
}

// A stack left on the message by an earlier failure must not describe this one.
func TestMiddleware_NonPanicDropsAnIncomingStack(t *testing.T) {
	p, dl, _ := newStep(t, nil)
	res := run(t, p, failing(sluice.Permanent(errDeclined)), message.Metadata{
		sluice.HeaderErrorStack: "goroutine 1 [running]:\nold.frame()",
		sluice.HeaderErrorType:  "panic",
	})
	require.NoError(t, res.err)
	require.Len(t, dl.Calls(), 1)
	md := dl.Calls()[0].msg.Metadata
	assert.NotContains(t, md, sluice.HeaderErrorStack)
	assert.Equal(t, "error", md.Get(sluice.HeaderErrorType))
	assert.Equal(t, "goroutine 1 [running]:\nold.frame()", res.msg.Metadata.Get(sluice.HeaderErrorStack), "the original keeps its headers")
}

func TestMiddleware_DeadLetterFails(t *testing.T) {
	p, dl, events := newStep(t, errBroker)
	herr := sluice.Permanent(errDeclined)
	res := run(t, p, failing(herr), message.Metadata{sluice.HeaderRetryCount: "2"})
	require.Error(t, res.err)
	var gb *carry.GiveBack
	assert.ErrorAs(t, res.err, &gb, "the original must be nacked")
	assert.ErrorIs(t, res.err, errBroker)
	assert.Contains(t, res.err.Error(), res.msg.UUID)
	assert.Contains(t, res.err.Error(), strconv.Quote(queueName))
	assert.Len(t, dl.Calls(), 1)
	assert.Empty(t, events.All(), "a dead letter is reported once confirmed")
	require.True(t, res.reported)
	assert.Equal(t, disposition.GiveBack, res.report.Outcome)
	assert.Equal(t, 3, res.report.Attempt)
	assert.ErrorIs(t, res.report.Err, errBroker)
	assert.Equal(t, res.before, res.msg.Metadata, "the original is unchanged")
	assert.Equal(t, broker.SettleReject, res.settlement, "a failed dead letter is a failure: requeued after a pause, counted")
}

func TestMiddleware_NotDeadLettered(t *testing.T) {
	// Used alone, the step acks a Discard and gives back what an inner step returns
	// unprocessed.
	handoff := markers.ReturnUnprocessed(errBroker)
	outputs := []*message.Message{message.NewMessage("out-1", []byte("x"))}
	tests := []struct {
		name       string
		h          message.HandlerFunc
		wantOut    []*message.Message
		wantErr    error // returned as is; nil: acked
		wantReport *steptest.Report
	}{
		{name: "success", h: func(*message.Message) ([]*message.Message, error) { return outputs, nil }, wantOut: outputs},
		{name: "returned unprocessed from below", h: failing(handoff), wantErr: errBroker, wantReport: &steptest.Report{Outcome: disposition.GiveBack, Attempt: 1, Err: errBroker}},
		{name: "Discard", h: failing(sluice.Discard(errBroker)), wantReport: &steptest.Report{Outcome: disposition.Discard, Attempt: 1, Err: sluice.Discard(errBroker)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, dl, events := newStep(t, nil)
			res := run(t, p, tt.h, nil)
			if tt.wantErr != nil {
				var gb *carry.GiveBack
				assert.ErrorAs(t, res.err, &gb, "given back")
				assert.ErrorIs(t, res.err, tt.wantErr)
				assert.Equal(t, broker.SettleReturn, res.settlement, "returned unprocessed: at once, not counted as a failed delivery")
			} else {
				assert.NoError(t, res.err)
			}
			assert.Equal(t, tt.wantOut, res.out)
			assert.Empty(t, dl.Calls(), "no dead letter")
			assert.Empty(t, events.All())
			if tt.wantReport != nil {
				assert.True(t, res.reported)
				assert.Equal(t, *tt.wantReport, res.report)
			} else {
				assert.False(t, res.reported, "reported %+v", res.report)
			}
		})
	}
}

// Issue 33: a key function's failure is recorded as the key function's, typed as its cause,
// with no handler named (the handler never ran).
func TestMiddleware_RecordNamesTheStageThatFailed(t *testing.T) {
	var v map[string]any
	syntaxErr := json.Unmarshal([]byte("{broken"), &v)
	require.Error(t, syntaxErr)
	p, dl, _ := newStep(t, nil)
	keyErr := sluice.Permanent(&idempotency.KeyError{MessageID: "m-1", Err: syntaxErr})
	res := run(t, p, failing(keyErr), message.Metadata{headers.Handler: "forged"})
	require.NoError(t, res.err)
	calls := dl.Calls()
	require.Len(t, calls, 1)
	md := calls[0].msg.Metadata
	assert.Equal(t, "idempotency key function", md.Get(headers.FailedStage))
	assert.NotContains(t, md, headers.Handler, "no handler ran")
	assert.Equal(t, "json.SyntaxError", md.Get(sluice.HeaderErrorType))
}

// The record says why sluice stopped trying (x-dead-letter-reason) beside what failed
// (x-error-type), and a reason the message arrived with is replaced.
func TestMiddleware_RecordNamesTheReason(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"permanent", sluice.Permanent(errDeclined), decide.ReasonPermanent},
		{"retries exhausted", &decide.ExhaustedError{Retries: 3, Err: errDeclined}, decide.ReasonRetriesExhausted},
		{"older than MaxTotalAge", &decide.ExhaustedError{Retries: 1, Age: 2 * time.Hour, Err: errDeclined}, decide.ReasonMaxAge},
		{"learned policy", &decide.UnlikelyError{Evidence: decide.Evidence{ErrorType: "error", Ended: 40, Window: time.Hour}, Err: errDeclined},
			decide.ReasonRetryUnlikely},
		{"retryable, the step used alone", errDeclined, decide.ReasonNoDelay},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, dl, _ := newStep(t, nil)
			res := run(t, p, failing(tt.err), message.Metadata{headers.DeadLetterReason: "forged"})
			require.NoError(t, res.err)
			calls := dl.Calls()
			require.Len(t, calls, 1)
			assert.Equal(t, tt.want, calls[0].msg.Metadata.Get(headers.DeadLetterReason))
		})
	}
}
