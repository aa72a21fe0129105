package testenv

import (
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	req "github.com/stretchr/testify/require"
)

// A node that ended but was not reaped yet (a detached node's parent is init, which reaps
// when it gets to it) is not running: Stop must not wait for it, nor a boot count on it.
func TestProcessAliveSeesThroughZombies(t *testing.T) {
	cmd := exec.Command("true")
	req.NoError(t, cmd.Start())
	pid := cmd.Process.Pid
	req.Eventually(t, func() bool { return !processAlive(pid) }, 10*time.Second, 10*time.Millisecond,
		"an ended child, not yet waited for, is a zombie and not alive")
	req.NoError(t, cmd.Wait())
	assert.False(t, processAlive(pid), "a reaped process")

	sleep := exec.Command("sleep", "30")
	req.NoError(t, sleep.Start())
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	assert.True(t, processAlive(sleep.Process.Pid), "a running process")
}
