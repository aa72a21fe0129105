package idempotency_test

import (
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
)

// watermillCleanup is the goroutine Watermill's map repository (benchmarked beside the
// sluice store) starts and never stops; it is not this package's to leak.
var watermillCleanup = goleak.IgnoreTopFunction(
	"github.com/ThreeDotsLabs/watermill/message/router/middleware.(*mapExpiringKeyRepository).cleanOutLoop")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, watermillCleanup)
}

// fakeClock is a settable clock for TTL and lease tests; its start has 0 nanoseconds so
// that expiry instants land exactly on the store's even-nanosecond grid.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// newMessage returns a message with id and, unless key is empty, idempotency-key metadata.
func newMessage(id, key string) *message.Message {
	msg := message.NewMessage(id, []byte(`{}`))
	if key != "" {
		msg.Metadata.Set(sluice.HeaderIdempotencyKey, key)
	}
	return msg
}
