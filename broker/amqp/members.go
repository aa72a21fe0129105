package amqp

import (
	"context"

	"github.com/sluice-go/sluice/internal/membership"
)

// Join starts announcing this instance among queue's members and listening to the others
// (see internal/membership, which router's rebalancing uses). It returns once the
// listening queue is bound, so the first heartbeats are heard.
func (b *Broker) Join(ctx context.Context, queue string, cfg membership.Config) (*membership.Membership, error) {
	return membership.Join(ctx, b.conn.channel, ErrClosed, queue, cfg)
}
