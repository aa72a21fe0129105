package amqp

import (
	"cmp"
	"errors"
	"log/slog"
	"slices"
	"sync"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/pausegate"
)

// Pause stops taking deliveries: the consumer is cancelled, deliveries prefetched but not
// yet handed to a handler go back to the queue with basic.nack and requeue, in delivery
// order, and messages with a handler finish and are settled as usual. A classic queue
// (sluice's default) puts a returned message back in its place, so it keeps its order; a
// quorum queue may deliver a returned message after later ones. The return is the one a shutdown makes, not a
// failure's basic.reject; RabbitMQ before 4.3 still counts it toward a quorum queue's
// delivery limit, so each pause adds one to at most Prefetch messages. Pause does not
// wait.
func (s *Subscriber) Pause() { s.gate.Set(true, 0) }

// Resume takes deliveries again. A positive limit caps the deliveries outstanding at once
// (prefetch and handlers both) until Resume is called with another limit; zero restores
// the subscription's own Concurrency and Prefetch. Resume does not wait.
func (s *Subscriber) Resume(limit int) { s.gate.Set(false, limit) }

// Paused reports whether Pause was called after the last Resume.
func (s *Subscriber) Paused() bool { return s.gate.State().Paused }

// optsFor returns the settings a consumer uses in st.
func optsFor(o broker.SubscribeOptions, st pausegate.State) broker.SubscribeOptions {
	if st.Limit > 0 {
		o.Concurrency = min(o.Concurrency, st.Limit)
		o.Prefetch = st.Limit
	}
	return o
}

func closedChan(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// errGateChanged ends a consumer that stopped for Pause or Resume.
var errGateChanged = errors.New("consumer restarted for pause or resume")

// returns collects the deliveries a consumer gives back for Pause or Resume, so that they
// go back in delivery order once its handlers are done: a classic queue puts a returned
// message back in its place whatever the order, but a quorum queue goes by the order the
// returns arrive in, and workers giving theirs back at once would shuffle them more.
type returns struct {
	changed <-chan struct{}

	mu sync.Mutex
	ds []amqp091.Delivery
}

func (r *returns) add(d amqp091.Delivery) {
	r.mu.Lock()
	r.ds = append(r.ds, d)
	r.mu.Unlock()
}

// flush returns the collected deliveries with basic.nack and requeue, in tag order.
func (r *returns) flush(acks *acker, logger *slog.Logger) {
	r.mu.Lock()
	ds := r.ds
	r.ds = nil
	r.mu.Unlock()
	slices.SortFunc(ds, func(a, b amqp091.Delivery) int { return cmp.Compare(a.DeliveryTag, b.DeliveryTag) })
	for _, d := range ds {
		if err := d.Nack(false, true); err != nil {
			// The channel is gone, and RabbitMQ returned the delivery with it.
			logger.Debug("return of a delivery on pause failed", "error", err)
		}
		acks.nacked(d.DeliveryTag)
	}
}
