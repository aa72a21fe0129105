// Package handover shares the done idempotency keys of one instance of a rebalanced
// handler (router.WithRebalancing) with the others, so that the new owner of a moved
// partition knows what its previous owner completed.
package handover

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/middleware/idempotency"
)

// Keys shares the done idempotency keys of one instance with the others of a
// rebalanced handler, through the membership's broadcast (RabbitMQ), in the store's
// snapshot format: a done key is a fact whichever partition it belongs to, so every
// receiver loads all of it, and the new owner of a moved partition knows the keys its
// previous owner completed.
type Keys struct {
	store  *idempotency.Store
	logger *slog.Logger
}

// New returns the hand-over of store's done keys; failures are logged to logger.
func New(store *idempotency.Store, logger *slog.Logger) *Keys {
	return &Keys{store: store, logger: logger}
}

// snapshot returns the store's done keys in the snapshot format.
func (h *Keys) snapshot() ([]byte, error) {
	dir, err := os.MkdirTemp("", "sluice-handover-")
	if err != nil {
		return nil, fmt.Errorf("hand over idempotency keys: %w", err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "keys")
	if err := h.store.SaveSnapshot(path); err != nil {
		return nil, fmt.Errorf("hand over idempotency keys: %w", err)
	}
	return os.ReadFile(path)
}

// Send broadcasts the done keys to queue's members; a failure is logged, the cost being
// double work on the new owner.
func (h *Keys) Send(ctx context.Context, m broker.Membership, queue string) {
	body, err := h.snapshot()
	if err == nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err = m.Broadcast(sctx, body)
		cancel()
	}
	if err != nil {
		h.logger.Warn("handing idempotency keys over failed; the new owner may handle duplicates again", "queue", queue, "error", err)
	}
}

// Receive loads a snapshot another instance sent (broker.MembershipConfig.OnBroadcast).
func (h *Keys) Receive(from string, body []byte) {
	dir, err := os.MkdirTemp("", "sluice-handover-")
	if err == nil {
		defer os.RemoveAll(dir)
		path := filepath.Join(dir, "keys")
		if err = os.WriteFile(path, body, 0o600); err == nil {
			err = h.store.LoadSnapshot(path)
		}
	}
	if err != nil {
		h.logger.Warn("loading idempotency keys handed over failed", "from", from, "error", err)
	}
}
