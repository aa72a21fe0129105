package retry

import (
	"sync"
	"time"
)

// windowBuckets is how many buckets a sliding window is cut into: counts age out a tenth
// of the window at a time instead of all at once.
const windowBuckets = 10

// counts are what a window keeps per bucket.
type counts struct {
	first    int64 // first attempts (x-retry-count 0) that reached the handler
	retries  int64 // retries scheduled soon (within the budget)
	attempts int64 // attempts that said something about the dependency
	failures int64 // of which retryable failures
}

func (c *counts) add(o counts) {
	c.first += o.first
	c.retries += o.retries
	c.attempts += o.attempts
	c.failures += o.failures
}

// window is a sliding window of counts: a ring of buckets of width Window/windowBuckets.
type window struct {
	mu     sync.Mutex
	width  time.Duration
	start  time.Time // start of buckets[head]
	head   int
	bucket [windowBuckets]counts
}

func newWindow(d time.Duration, now time.Time) *window {
	return &window{width: d / windowBuckets, start: now}
}

// advance moves the window to now, clearing the buckets it leaves behind. Called with mu.
func (w *window) advance(now time.Time) {
	steps := int(now.Sub(w.start) / w.width)
	if steps <= 0 {
		return
	}
	if steps >= windowBuckets {
		w.bucket = [windowBuckets]counts{}
		w.head = 0
		w.start = now
		return
	}
	for range steps {
		w.head = (w.head + 1) % windowBuckets
		w.bucket[w.head] = counts{}
	}
	w.start = w.start.Add(time.Duration(steps) * w.width)
}

// add records c at now.
func (w *window) add(now time.Time, c counts) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.advance(now)
	w.bucket[w.head].add(c)
}

// sum returns the counts of the whole window at now.
func (w *window) sum(now time.Time) counts {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sumLocked(now)
}

func (w *window) sumLocked(now time.Time) counts {
	w.advance(now)
	var total counts
	for i := range w.bucket {
		total.add(w.bucket[i])
	}
	return total
}
