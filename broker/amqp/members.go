package amqp

import (
	"context"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/membership"
)

// Join starts announcing this instance among queue's members and listening to the others,
// for router.WithRebalancing: every instance publishes a heartbeat every cfg.Interval to
// the fanout exchange sluice.members.<queue> and hears everyone's on an exclusive,
// auto-deleted queue of its own. A member is listed while heard within cfg.Expiry (three
// intervals by default); one that closes its membership says goodbye and leaves the lists
// at once. Heartbeats expire in the broker after Expiry, so a slow listener is not misled
// by old ones. It returns once the listening queue is bound, so the first heartbeats are
// heard.
func (b *Broker) Join(ctx context.Context, queue string, cfg broker.MembershipConfig) (broker.Membership, error) {
	m, err := membership.Join(ctx, b.conn.channel, broker.ErrClosed, queue, cfg)
	if err != nil {
		return nil, err
	}
	return m, nil
}
