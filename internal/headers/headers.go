// Package headers holds sluice's header sets, so that the marshaler (which drops sluice's own
// headers last), the replay (which resets the retry state and the failure record) and the
// steps that write them agree on one list, and the failure record both steps stamp.
package headers

import (
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/failure"
)

// RetryState are the headers the retry step writes on every hand-off.
var RetryState = []string{
	sluice.HeaderRetryCount,
	FirstFailureTime,
	LastFailureTime,
	sluice.HeaderLastError,
	sluice.HeaderLastErrorMessage,
	sluice.HeaderRetryHistory,
	DeferCount,
	FirstDeferTime,
	ArrivedRetryCount,
	TripAttempts,
}

// FailureRecord are the headers the poison step adds to a dead-letter copy.
var FailureRecord = []string{
	sluice.HeaderErrorType,
	sluice.HeaderErrorMessage,
	sluice.HeaderErrorStack,
	ErrorClass,
	DeadLetterReason,
	Handler,
	FailedAt,
	FailedHost,
	FailedPID,
	FailedStage,
	CompensationID,
	CompensationTo,
	CompensationError,
}

// Carried are sluice's headers that travel with a message and survive a replay.
var Carried = []string{
	sluice.HeaderOriginalQueue,
	sluice.HeaderIdempotencyKey,
	ReplayCount,
	TraceParent,
	TraceState,
}

// Set returns the union of lists and extra as a set.
func Set(lists [][]string, extra ...string) map[string]bool {
	set := make(map[string]bool)
	for _, l := range lists {
		for _, k := range l {
			set[k] = true
		}
	}
	for _, k := range extra {
		set[k] = true
	}
	return set
}

// BrokerOwned reports whether RabbitMQ owns a header: sluice reads it and never writes it
// back, so dead-lettering records do not pile up from retry to retry, and a producer's
// sender-selected routing (CC, BCC) never routes a copy sluice publishes with its own
// rights (a retry copy through the delay cascade, a dead letter through sluice.dlx).
func BrokerOwned(key string) bool {
	switch key {
	case "x-death", "x-delivery-count", "x-received-from":
		return true
	}
	if SenderSelected(key) {
		return true
	}
	return strings.HasPrefix(key, "x-first-death-") || strings.HasPrefix(key, "x-last-death-")
}

// CopyWithRoom is msg.CopyWithContext with room for extra more metadata entries: Watermill's
// copy fills a map made without a size, which grows (and allocates) several times on the
// way, and the copy then grows again for the failure record a step adds.
func CopyWithRoom(msg *message.Message, extra int) *message.Message {
	c := message.NewMessage(msg.UUID, msg.Payload)
	c.Metadata = make(message.Metadata, len(msg.Metadata)+extra)
	maps.Copy(c.Metadata, msg.Metadata)
	c.SetContext(msg.Context())
	return c
}

// Failure is one failed attempt, as StampFailure records it.
type Failure struct {
	// Queue is the queue the message was consumed from, which x-original-queue always names.
	Queue string
	// RetryCount is the x-retry-count to write.
	RetryCount int
	// Attempt is the failed attempt's number, for x-retry-history.
	Attempt int
	// First is the x-first-failure-time to write when the message has no valid one of
	// sluice's own; zero means Now.
	First time.Time
	// Now is the failure's time.
	Now time.Time
	// Err is the handler's error.
	Err error
}

// StampFailure writes the retry state of failure f on md, the metadata of a copy of a message
// whose metadata before the failure was prev: the retry count, first and last failure
// times, the last error and the history. The retry step stamps it on the retry copy and the
// poison step on the dead-letter copy, before adding its failure record.
func StampFailure(md, prev message.Metadata, f Failure) {
	errType := sluice.ErrorType(f.Err)
	md.Set(sluice.HeaderRetryCount, strconv.Itoa(f.RetryCount))
	trip := ReadTrip(prev)
	StampOrigin(md, prev, f.Queue, trip.Carried)
	// A producer's history and first failure time are moved aside: the record's are
	// sluice's own.
	history := stampTrip(md, prev, trip)
	// A first failure is also the last: its time is formatted once.
	now := failure.FormatTime(f.Now)
	if _, ok := failure.Time(history, FirstFailureTime, f.Now); !ok {
		first := now
		if !f.First.IsZero() && f.First != f.Now {
			first = failure.FormatTime(f.First)
		}
		md.Set(FirstFailureTime, first)
	}
	md.Set(LastFailureTime, now)
	md.Set(sluice.HeaderLastError, errType)
	md.Set(sluice.HeaderLastErrorMessage, failure.Truncate(sluice.ErrorMessage(f.Err), failure.MaxErrorMessageBytes))
	md.Set(sluice.HeaderRetryHistory, failure.AppendHistory(history, failure.HistoryEntry{
		At: f.Now.UTC(), Attempt: f.Attempt, Type: errType, Message: sluice.ErrorMessage(f.Err),
	}))
}

// SenderSelected reports whether RabbitMQ routes a message by header key (sender-selected
// distribution: CC and BCC name more routing keys on the exchange published to).
func SenderSelected(key string) bool { return key == "CC" || key == "BCC" }
