package breaker

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// A full map prunes what expired, and only that, whether or not its scan could be
// skipped; oldest stays at or before every remembered failure.
func TestFailedMessagesPruneExpiredOnly(t *testing.T) {
	const window = time.Minute
	start := time.Unix(1_000_000, 0)
	f := newFailedMessages(window)
	check := func(when string) {
		t.Helper()
		for id, at := range f.seen {
			if at.Before(f.oldest) {
				t.Fatalf("%s: %s failed at %s, before oldest %s", when, id, at, f.oldest)
			}
		}
	}
	// Half the map fails early, half later: a burst of distinct failures.
	for i := range maxRememberedFailures {
		at := start
		if i >= maxRememberedFailures/2 {
			at = start.Add(window / 2)
		}
		if !f.first("m"+strconv.Itoa(i), at) {
			t.Fatalf("m%d: a first failure counted as a repeat", i)
		}
	}
	check("filled")
	// Full, nothing expired: one arbitrary failure is forgotten per new one.
	for i := range 100 {
		if !f.first("burst"+strconv.Itoa(i), start.Add(window/2)) {
			t.Fatal("a first failure counted as a repeat")
		}
		if len(f.seen) != maxRememberedFailures {
			t.Fatalf("remembers %d, want %d", len(f.seen), maxRememberedFailures)
		}
	}
	check("burst")
	// The early half expires: the next failure forgets exactly those.
	late := start.Add(window)
	kept := 0
	for _, at := range f.seen {
		if late.Sub(at) < window {
			kept++
		}
	}
	if !f.first("after", late) {
		t.Fatal("a first failure counted as a repeat")
	}
	if len(f.seen) != kept+1 {
		t.Fatalf("remembers %d after the early half expired, want %d", len(f.seen), kept+1)
	}
	check("expired")
	if f.first("after", late.Add(time.Second)) {
		t.Fatal("a repeat within the window counted as a first failure")
	}
	// Random times, some out of order (concurrent callers read the clock before the lock).
	for i := range 3 * maxRememberedFailures {
		at := late.Add(time.Duration(i)*time.Millisecond*20 - time.Duration(rand.IntN(1000))*time.Millisecond)
		f.first("r"+strconv.Itoa(rand.IntN(2*maxRememberedFailures)), at)
		if len(f.seen) > maxRememberedFailures {
			t.Fatalf("remembers %d, over %d", len(f.seen), maxRememberedFailures)
		}
	}
	check("random")
}
