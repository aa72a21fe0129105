package idempotency_test

import (
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/middleware/idempotency"
)

// A Guard absorbing a duplicate: the second delivery of payment p-1, though it has another
// message id, is acked without calling the handler. The key comes from the body here;
// a producer's idempotency-key header, when present, takes precedence.
func ExampleGuard() {
	g, err := idempotency.New(idempotency.Config{
		KeyFunc: func(msg *message.Message) (string, error) {
			var p struct {
				PaymentID string `json:"payment_id"`
			}
			// An error here is bad input: the message is dead-lettered as Permanent.
			err := json.Unmarshal(msg.Payload, &p)
			return p.PaymentID, err
		},
		OnDuplicate: func(msg *message.Message, key string) {
			fmt.Println("duplicate of", key, "acked:", msg.UUID)
		},
	})
	if err != nil {
		panic(err)
	}
	defer g.Close() // after the router has stopped, so a snapshot (SnapshotPath) is complete

	// In a router: r.AddMiddleware(g.Middleware); in sluice's stack: Config.Idempotency.
	charge := g.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		fmt.Println("charging for", msg.UUID)
		return nil, nil
	})
	for _, id := range []string{"m-1", "m-2"} {
		if _, err := charge(message.NewMessage(id, []byte(`{"payment_id":"p-1"}`))); err != nil {
			panic(err)
		}
	}
	st := g.Stats()
	fmt.Println("keys:", st.Keys, "hits:", st.Hits)
	// Output:
	// charging for m-1
	// duplicate of p-1 acked: m-2
	// keys: 1 hits: 1
}
