package dlq

import (
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/internal/dlqwire"
)

// SkipDestinationCheck lets r publish to a missing queue, so that the publish is returned
// at commit and the restore path runs.
func SkipDestinationCheck(r *replayer) { r.skipDestinationCheck = true }

// SelectionRecord is selectionRecord, for comparing it with NewRecord.
var SelectionRecord = selectionRecord

// The package's unexported helpers, under the names the external tests use.
var (
	Fingerprint      = cachedFingerprint
	GroupID          = groupID
	NormalizeMessage = normalizeMessage
	NewRecord        = newRecord
	NewReplayer      = newReplayer
	NewUnroutedEvent = newUnroutedEvent
	Purge            = purgeQueue
	ReplayPublishing = func(d amqp091.Delivery, n int, now time.Time, source, dest string) amqp091.Publishing {
		return replayPublishing(d, n, now, source, dest, 0)
	}
	MaskError = dlqwire.MaskError
	// MatchSelector and ValidateSelector are what every operation does with its Selector.
	MatchSelector    = Selector.match
	ValidateSelector = Selector.validate
	// ErrNoConnection is what an Inspector or Operator without a Conn returns.
	ErrNoConnection = errNoConnection
)

// Unexported types and constants, under the names the external tests use.
type (
	Replayer     = replayer
	ReplayResult = replayResult
	Replayed     = Moved
)

const (
	DefaultRetention = dlqwire.DefaultRetention
	HeaderArchivedAt = headerArchivedAt
	UnroutedQueue    = unroutedQueue
)
