package idempotency

import "time"

// Aliases for the package's external tests.
const DefaultInFlightDeferral = defaultInFlightDeferral
const MaxMaxKeys = maxMaxKeys
const ErrorTypeKey = errorTypeKey

var NewStore = newStore

type Status = keyStatus

const (
	Acquired = keyAcquired
	Done     = keyDone
	InFlight = keyInFlight
)

// JournalBatch encodes the records of keys (as the step scopes them for handler, from
// idempotency-key metadata), done until exp, as one journal message.
func JournalBatch(handler string, keys []string, exp time.Time) []byte {
	recs := make([]record, len(keys))
	for i, k := range keys {
		recs[i] = record{key: scopedDigest(handler, sourceMetadata, k), exp: exp.UnixNano()&^1 | 1}
	}
	return encodeBatch(recs)
}

const MaxJournalBatch = maxJournalBatch

// The store's claim on a plain key, which the step itself only makes on scoped digests.
type Lease = keyLease

func (s *Store) Begin(key string) (Lease, Status, time.Duration) { return s.beginKey(key) }
func (s *Store) Complete(l Lease)                                { s.complete(l) }
func (s *Store) Release(l Lease)                                 { s.release(l) }

// Validate is what New does with a Config.
func (c Config) Validate() error { return c.validate() }
