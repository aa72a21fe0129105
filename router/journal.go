package router

import (
	"context"
	"fmt"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/router/internal/journal"
)

// ErrRestoring is the reason of a message returned unprocessed because the stack closed
// (or its restore failed) before its idempotency journal was restored.
var ErrRestoring = journal.ErrRestoring

// journalSlot returns a slot for hc's idempotency step when it journals, else nil; s.mu is
// held.
func (s *Stack) journalSlot(hc handlerConfig) *journal.Slot {
	jr, ok := s.broker.(broker.Journaler)
	if hc.journal == "" || !ok || s.guard == nil || !s.guard.Journals() {
		return nil // no journal, or its journal is off: the guard's plain step
	}
	sl := journal.NewSlot(s.guard, jr, hc.journal, hc.keyFunc, s.chain.Observers(), s.closing)
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
	if s.guard == nil {
		return nil
	}
	return s.guard.Store()
}
