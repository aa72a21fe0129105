package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// BeamPID returns the operating-system process id of the node's Erlang VM (beam.smp). The
// node itself says it (os:getpid() through rabbitmqctl), and it must agree with the pid
// file the node wrote in its own directory: a test that signals the node (SIGSTOP to freeze
// it) must never reach another process, least of all the shared node.
func (n *Node) BeamPID() (int, error) {
	out, err := n.Ctl("eval", "os:getpid().")
	if err != nil {
		return 0, fmt.Errorf("node %s: ask its pid: %v: %s", n.Name, err, out)
	}
	said, err := strconv.Atoi(strings.Trim(strings.TrimSpace(out), `"`))
	if err != nil {
		return 0, fmt.Errorf("node %s: os:getpid() answered %q", n.Name, out)
	}
	if file := n.pid(); file != said {
		return 0, fmt.Errorf("node %s: os:getpid() is %d but its pid file says %d", n.Name, said, file)
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", said))
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(comm)), "beam") {
		return 0, fmt.Errorf("node %s: process %d is not an Erlang VM (%q, %v)", n.Name, said, comm, err)
	}
	return said, nil
}

// Freeze stops the node's VM with SIGSTOP, as a machine that stalls (swapping, a paused
// VM) would: its sockets stay open and the kernel still accepts connections, but nothing
// is read or answered (rabbitmqctl included). It returns thaw, which resumes the VM
// (SIGCONT); thaw also runs when t ends, before the node is stopped, whatever the test
// did. Calling thaw again does nothing.
func (n *Node) Freeze(t testing.TB) (thaw func() error, err error) {
	t.Helper()
	pid, err := n.BeamPID()
	if err != nil {
		return nil, err
	}
	var once sync.Once
	thaw = func() error {
		var err error
		once.Do(func() {
			if e := syscall.Kill(pid, syscall.SIGCONT); e != nil {
				err = fmt.Errorf("node %s: SIGCONT %d: %w", n.Name, pid, e)
			}
		})
		return err
	}
	// Registered before the signal: a test that fails while the node is frozen still thaws
	// it, and t's cleanups run last-registered first, so before StartNode's Stop.
	t.Cleanup(func() { _ = thaw() })
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("node %s: SIGSTOP %d: %w", n.Name, pid, err)
	}
	return thaw, nil
}
