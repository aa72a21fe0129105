package testenv

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// LockUnrouted holds, until t ends, a lock that serializes every test reading RabbitMQ's
// queue sluice.unrouted, across test processes (go test runs packages in parallel). The
// queue is shared by the whole vhost, and a reader takes messages without acknowledging
// them: while one test reads, another would not see those messages, and a replay would
// skip them.
func LockUnrouted(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "sluice-unrouted.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("open the sluice.unrouted test lock: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		t.Fatalf("take the sluice.unrouted test lock: %v", err)
	}
	t.Cleanup(func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	})
}
