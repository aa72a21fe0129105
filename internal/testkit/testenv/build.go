package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

var (
	buildMu    sync.Mutex
	buildCache = map[string]string{}
	buildDir   string
)

// Binary builds the command at pkg (a path relative to the module root, such as
// "./cmd/payments") with the race detector, once per test process, and returns the
// executable's path.
func Binary(t testing.TB, pkg string) string {
	t.Helper()
	return build(t, pkg, true)
}

// PlainBinary is Binary without the race detector, for measurements (memory, speed).
func PlainBinary(t testing.TB, pkg string) string {
	t.Helper()
	return build(t, pkg, false)
}

func build(t testing.TB, pkg string, race bool) string {
	t.Helper()
	key := pkg
	if !race {
		key += "#plain"
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := buildCache[key]; ok {
		return p
	}
	if buildDir == "" {
		d, err := os.MkdirTemp("", "sluice-bin-")
		if err != nil {
			t.Fatalf("temp dir for binaries: %v", err)
		}
		buildDir = d
	}
	out := filepath.Join(buildDir, strings.ReplaceAll(strings.Trim(key, "./"), "/", "_"))
	args := []string{"build", "-o", out, pkg}
	if race {
		args = []string{"build", "-race", "-o", out, pkg}
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = ModuleRoot(t)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	buildCache[key] = out
	return out
}

// ModuleRoot returns the repository root (where go.mod is).
func ModuleRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the module root")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}
