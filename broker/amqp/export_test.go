package amqp

import hdr "github.com/sluice-go/sluice/internal/headers"

// SetConsistentHashType makes DeclarePartitioned declare exchanges of type t, and returns
// a function that restores the real type.
func SetConsistentHashType(t string) (restore func()) {
	old := consistentHashType
	consistentHashType = t
	return func() { consistentHashType = old }
}

const AlternateExchangeArg = alternateExchangeArg
const DefaultFrameMax = defaultFrameMax
const MaxPartitionKeyBytes = maxPartitionKeyBytes
const MetadataPriority = hdr.Priority
const MetadataDeliveryMode = hdr.DeliveryMode
const MetadataTimestamp = hdr.Timestamp
const MetadataMessageID = hdr.MessageID

const JournalMaxBytes = journalMaxBytes
const MaxDelay = maxDelay

// JournalStatsOf is journalStatsOf, for the tests of a journal's repairs.
var JournalStatsOf = journalStatsOf

// JournalStats is journalStats, for the tests of a journal's repairs.
type JournalStats = journalStats

// The cascade's and the watermill config's refusals, for their tests.
var (
	ErrDelayTooLong       = errDelayTooLong
	ErrWatermillMarshaler = errWatermillMarshaler
)
