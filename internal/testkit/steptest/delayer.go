package steptest

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// DelayerFunc is a function with the retry step's Delayer method, for tests and benchmarks
// that hand a delay to code of their own.
type DelayerFunc func(ctx context.Context, queue string, d time.Duration, msg *message.Message) error

// Delay calls f.
func (f DelayerFunc) Delay(ctx context.Context, queue string, d time.Duration, msg *message.Message) error {
	return f(ctx, queue, d, msg)
}
