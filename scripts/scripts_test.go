// Package scripts_test checks what make test's scripts promise about the machine they run
// on: what they say before installing or when they cannot, the RabbitMQ versions they accept,
// and why a node cannot start. None of these tests installs, starts or changes anything.
package scripts_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func dir(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Dir(file)
}

// fakeChroot makes a cache folder whose chroot holds RabbitMQ version, as far as
// scripts/rabbitmq4.sh looks before it mounts or runs anything.
func fakeChroot(t *testing.T, version string) string {
	t.Helper()
	cache := t.TempDir()
	root := filepath.Join(cache, "root", "usr", "lib", "rabbitmq")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "bin"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "lib", "rabbitmq_server-"+version), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "bin", "rabbitmq-server"), []byte("#!/bin/sh\nexit 1\n"), 0o755))
	return cache
}

// Issue 56: "4.3" was whatever Debian sid shipped that day. A chroot of another series is
// refused, naming its version; a cached chroot of a 4.3 release keeps working.
func TestRabbitMQ4AcceptsOnlyA43Chroot(t *testing.T) {
	tests := []struct {
		version string
		wantErr string
	}{
		{"4.3.6", ""},
		{"4.3.11", ""},
		{"4.4.0", "has RabbitMQ 4.4.0, not 4.3.x"},
		{"4.2.9", "has RabbitMQ 4.2.9, not 4.3.x"},
	}
	for _, tt := range tests {
		t.Run(tt.version, func(t *testing.T) {
			cmd := exec.Command(filepath.Join(dir(t), "rabbitmq4.sh"), "ensure")
			cmd.Env = append(os.Environ(), "SLUICE_RABBITMQ4_CACHE="+fakeChroot(t, tt.version))
			out, err := cmd.CombinedOutput()
			if tt.wantErr == "" {
				require.NoError(t, err, "%s", out)
				return
			}
			require.Error(t, err)
			assert.Contains(t, string(out), tt.wantErr)
		})
	}
}

// A node that cannot start says why: "make bench" with another RabbitMQ already on the port
// said "needs root and Debian's mirror" and pointed at an empty log folder.
func TestRabbitMQ310SaysWhichPortIsTaken(t *testing.T) {
	if _, err := os.Stat("/usr/lib/rabbitmq/bin/rabbitmq-server"); err != nil {
		t.Skip("no rabbitmq-server on this machine: scripts/rabbitmq310.sh has nothing to start")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	port := l.Addr().(*net.TCPAddr).Port
	cmd := exec.Command(filepath.Join(dir(t), "rabbitmq310.sh"), "start", "taken", strconv.Itoa(port))
	cmd.Env = append(os.Environ(), "SLUICE_RABBITMQ310_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	assert.Contains(t, string(out), "cannot start on 127.0.0.1:"+strconv.Itoa(port)+": port "+strconv.Itoa(port)+" (AMQP) is in use by")
}

// Without root, provision.sh installs nothing and says exactly what is missing and how to
// install it (here: the commands hidden from its PATH).
func TestProvisionWithoutRootSaysWhatIsMissing(t *testing.T) {
	bin := t.TempDir()
	for _, tool := range []string{"id", "sort", "awk", "cat", "sed"} {
		p, err := exec.LookPath(tool)
		require.NoError(t, err)
		require.NoError(t, os.Symlink(p, filepath.Join(bin, tool)))
	}
	bash, err := exec.LookPath("bash")
	require.NoError(t, err)
	args := []string{bash, filepath.Join(dir(t), "provision.sh")}
	if os.Geteuid() == 0 {
		args = append([]string{"runuser", "-u", "nobody", "--"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = []string{"PATH=" + bin, "HOME=/"}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "a missing package is no failure of its own: %s", out)
	text := string(out)
	assert.Contains(t, text, "make test needs these Debian packages, which are not installed:")
	assert.Contains(t, text, "NOT INSTALLED (not root (running as ")
	for _, pkg := range []string{"prometheus", "chromium", "curl"} {
		assert.Contains(t, text, "\n  "+pkg+" ", "%s is listed with why and how big", pkg)
	}
	assert.Contains(t, text, "install them with: sudo apt-get install ")
	assert.Contains(t, text, "the tests that need them skip")
	assert.NotContains(t, text, "installing them with apt-get")
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "  prometheus ") {
			assert.Contains(t, line, "MB", "how big")
		}
	}
}
