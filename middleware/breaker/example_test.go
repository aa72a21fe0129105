package breaker_test

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/internal/markers"
	"github.com/sluice-go/sluice/middleware/breaker"
)

// A breaker that trips after two failures of distinct messages. While it is open the
// handler is not called: the message is deferred (sluice.Defer wrapping ErrOpen), which
// sluice's retry step turns into a broker-side delay that uses no retry attempt.
func ExampleRegistry() {
	reg, err := breaker.New(breaker.Config{
		ConsecutiveFailures: 2,
		OpenTimeout:         time.Minute,
		Logger:              slog.New(slog.DiscardHandler),
		OnStateChange: func(name string, from, to breaker.State) {
			fmt.Printf("%s: %s -> %s\n", name, from, to)
		},
	})
	if err != nil {
		panic(err)
	}

	// Handlers calling the same dependency share its breaker: name it after the
	// dependency, not the handler (the router's WithBreaker does this).
	charge := reg.Breaker("payment-gateway").Middleware(func(msg *message.Message) ([]*message.Message, error) {
		fmt.Println("calling the gateway for", msg.UUID)
		return nil, errors.New("gateway timeout")
	})

	for _, id := range []string{"pay-1", "pay-2", "pay-3"} {
		_, err := charge(message.NewMessage(id, nil))
		var deferred *markers.Defer
		switch {
		case errors.As(err, &deferred) && errors.Is(err, breaker.ErrOpen):
			fmt.Println(id, "deferred: breaker open")
		case err != nil:
			fmt.Println(id, "failed:", err)
		}
	}
	fmt.Println("state:", reg.State("payment-gateway"))
	// Output:
	// calling the gateway for pay-1
	// pay-1 failed: gateway timeout
	// calling the gateway for pay-2
	// payment-gateway: closed -> open
	// pay-2 failed: gateway timeout
	// pay-3 deferred: breaker open
	// state: open
}
