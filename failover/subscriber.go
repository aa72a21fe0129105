package failover

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// subscriber consumes a topic from several clusters at once (the primary's and the
// secondary's subscribers), so that messages published to the secondary during a failover
// are processed too. Each message is acked or nacked on the cluster it came from.
type subscriber struct {
	subs []message.Subscriber
}

// NewSubscriber returns a subscriber that consumes from all of subs at once (see
// subscriber), for the primary and the secondary cluster. Close closes them all.
func NewSubscriber(subs ...message.Subscriber) message.Subscriber {
	return &subscriber{subs: subs}
}

// Subscribe subscribes to topic on every cluster and merges the messages into one
// channel, closed once every cluster's channel is closed.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	ins := make([]<-chan *message.Message, 0, len(s.subs))
	for i, sub := range s.subs {
		in, err := sub.Subscribe(ctx, topic)
		if err != nil {
			return nil, fmt.Errorf("failover: subscribe to %q on cluster %d: %w", topic, i, err)
		}
		ins = append(ins, in)
	}
	out := make(chan *message.Message)
	var wg sync.WaitGroup
	for _, in := range ins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each subscriber closes its channel when ctx ends or it is closed; a message
			// nobody will read any more goes back to its cluster.
			for m := range in {
				select {
				case out <- m:
				case <-ctx.Done():
					m.Nack()
				}
			}
		}()
	}
	go func() {
		wg.Wait()
		close(out)
	}()
	return out, nil
}

// Close closes every cluster's subscriber.
func (s *subscriber) Close() error {
	var errs []error
	for _, sub := range s.subs {
		errs = append(errs, sub.Close())
	}
	return errors.Join(errs...)
}
