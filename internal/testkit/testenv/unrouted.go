package testenv

import (
	"os"
	"path/filepath"
	"strings"
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
	Lock(t, "sluice-unrouted")
}

// Lock holds, until t ends, the machine-wide lock called name, across test processes: for
// a test that needs something only one process at a time can have, such as a fixed port
// (make test runs its two parts' packages side by side, and go test two packages at once).
func Lock(t testing.TB, name string) {
	t.Helper()
	file := "sluice-" + strings.TrimPrefix(strings.NewReplacer("/", "-", ":", "-").Replace(name), "sluice-") + ".lock"
	f, err := os.OpenFile(filepath.Join(os.TempDir(), file), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("open the test lock %s: %v", name, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		t.Fatalf("take the test lock %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	})
}
