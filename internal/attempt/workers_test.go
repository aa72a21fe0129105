package attempt_test

import (
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/attempt"
)

// stuckHere blocks until release is closed: the frame an abandoned attempt's stack names.
func stuckHere(release <-chan struct{}) { <-release }

func TestWorkers(t *testing.T) {
	t.Run("attempts one after the other reuse a few goroutines, which Close ends", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		s := attempt.New(attempt.Config{Timeout: time.Second}, 0)
		goroutines := map[string]bool{}
		h := s.Middleware(func(*message.Message) ([]*message.Message, error) {
			buf := make([]byte, 64)
			goroutines[strings.Fields(string(buf[:runtime.Stack(buf, false)]))[1]] = true // "goroutine N [running]"
			return nil, nil
		})
		const attempts = 50
		for i := range attempts {
			_, err := h(message.NewMessage(strconv.Itoa(i), nil))
			require.NoError(t, err)
		}
		// The worker that ran an attempt parks itself just after the attempt's result is
		// handed back, so the next attempt may find it still busy and start one more
		// worker; from then on the two take turns. A goroutine per attempt would be 50.
		assert.Less(t, len(goroutines), 10, "goroutines that ran %d attempts one after the other", attempts)
		s.Close()
		s.Close() // idempotent
		// After Close an attempt still runs, on a goroutine that ends with it.
		_, err := h(message.NewMessage("late", nil))
		require.NoError(t, err)
	})

	t.Run("a stuck attempt keeps its goroutine: the next attempt runs on another, and the abandoned one's stack names where it is stuck", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		s := attempt.New(attempt.Config{Timeout: 50 * time.Millisecond, Grace: 50 * time.Millisecond}, 0)
		release := make(chan struct{})
		var calls sync.WaitGroup
		h := s.Middleware(func(m *message.Message) ([]*message.Message, error) {
			defer calls.Done()
			if m.UUID == "stuck" {
				stuckHere(release)
			}
			return nil, nil
		})
		calls.Add(2)
		_, err := h(message.NewMessage("stuck", nil))
		require.ErrorIs(t, err, sluice.ErrHandlerTimeout)
		var abandoned *attempt.Abandoned
		require.True(t, errors.As(err, &abandoned))
		assert.Contains(t, abandoned.Stack, "stuckHere", "the abandoned attempt's stack")
		_, err = h(message.NewMessage("next", nil))
		require.NoError(t, err, "the next attempt runs while the stuck one is still held")
		close(release)
		calls.Wait()
		s.Close()
	})
}
