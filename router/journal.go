package router

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/router/internal/journal"
)

// JournalingIdempotency is an Idempotency that also keeps its done keys on a broker's
// journal (idempotency.Guard does). When the stack's broker keeps journals
// (broker.Journaler: RabbitMQ), Run gives every handler's step the journal
// sluice.idempotency.<queue> of the queue it consumes (one per partition of a partitioned
// handler). Consuming starts at once (a partitioned handler claims its partitions as
// early as its peers), but no message is handled until every journal has restored the keys
// done within their TTL: a message that arrives meanwhile waits, unacknowledged, and is
// returned unprocessed when the stack closes first. /readyz (otelsetup.Operate) says
// "restoring" meanwhile. Middlewares, for a router of the user's own, does not journal.
type JournalingIdempotency interface {
	Idempotency
	// Journaled returns the step keeping its done keys on jr's journal name, once it has
	// restored them.
	Journaled(ctx context.Context, jr broker.Journaler, name string, key func(*message.Message) (string, error), observers ...disposition.Observer) (message.HandlerMiddleware, error)
}

// ErrRestoring is the reason of a message returned unprocessed because the stack closed
// (or its restore failed) before its idempotency journal was restored.
var ErrRestoring = journal.ErrRestoring

// journalSlot returns a slot for hc's idempotency step when it journals, else nil; s.mu is
// held.
func (s *Stack) journalSlot(hc handlerConfig, obs []disposition.Observer) *journal.Slot {
	if hc.journal == "" {
		return nil
	}
	jr, ok := s.broker.(broker.Journaler)
	if !ok {
		return nil
	}
	ji, ok := s.cfg.Idempotency.(JournalingIdempotency)
	if !ok {
		return nil
	}
	if j, ok := ji.(journal.Switch); ok && !j.Journals() {
		return nil // its journal is off: NewMiddleware, with nothing to restore
	}
	sl := journal.NewSlot(ji, jr, hc.journal, hc.keyFunc, obs, s.closing)
	s.slots = append(s.slots, sl)
	return sl
}

// restoreJournals restores every handler's idempotency journal, /readyz saying so meanwhile.
func (s *Stack) restoreJournals(ctx context.Context) error {
	s.mu.Lock()
	slots := s.slots
	s.mu.Unlock()
	if len(slots) == 0 {
		return nil
	}
	const pauser = "idempotency"
	s.pauses.Pause(pauser, fmt.Sprintf("restoring idempotency keys from %d journal(s)", len(slots)))
	defer s.pauses.Resume(pauser)
	return journal.Restore(ctx, slots)
}

// guardStore is the idempotency store whose done keys a rebalanced handler hands over;
// nil without one.
func (s *Stack) guardStore() *idempotency.Store {
	if ks, ok := s.cfg.Idempotency.(interface{ Store() *idempotency.Store }); ok {
		return ks.Store()
	}
	return nil
}
