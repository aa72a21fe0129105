package breaker

import (
	"sync"
	"time"
)

// maxRememberedFailures bounds the message ids a breaker remembers as having failed
// within its window: a burst of more distinct failures than that is an outage anyway.
const maxRememberedFailures = 4096

// failedMessages remembers which messages failed within the window, so that a message
// failing again (its retries, its redeliveries) is not counted again: one poison message
// retried in a quiet queue must not look like a failing dependency.
type failedMessages struct {
	window time.Duration

	mu   sync.Mutex
	seen map[string]time.Time // message id -> when its failure was counted
	// oldest is at or before every time in seen. While it is within the window nothing
	// has expired, and a full map skips prune's scan: in a burst of more distinct
	// failures than the map holds, every failure would otherwise scan all of them.
	oldest time.Time
}

func newFailedMessages(window time.Duration) *failedMessages {
	return &failedMessages{window: window, seen: make(map[string]time.Time)}
}

// first reports whether id's failure at now is the first within the window, and
// remembers it. A message without an id is always a first failure.
func (f *failedMessages) first(id string, now time.Time) bool {
	if id == "" {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if at, ok := f.seen[id]; ok && now.Sub(at) < f.window {
		return false
	}
	if len(f.seen) >= maxRememberedFailures {
		f.prune(now)
	}
	if len(f.seen) == 0 || now.Before(f.oldest) {
		f.oldest = now
	}
	f.seen[id] = now
	return true
}

// prune forgets failures older than the window and, if the map is still full, arbitrary
// ones: forgetting only makes a repeat count again, as it would have before.
func (f *failedMessages) prune(now time.Time) {
	if now.Sub(f.oldest) >= f.window {
		oldest := now
		for id, at := range f.seen {
			if now.Sub(at) >= f.window {
				delete(f.seen, id)
			} else if at.Before(oldest) {
				oldest = at
			}
		}
		f.oldest = oldest
	}
	for id := range f.seen {
		if len(f.seen) < maxRememberedFailures {
			return
		}
		delete(f.seen, id)
	}
}
