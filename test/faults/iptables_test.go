//go:build faults

package faults

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// chainPrefix names the iptables chains the partition scenario makes; the process id
// follows, so a chain left by a killed run is recognized and removed by the next one.
const chainPrefix = "SLUICE-PART-"

// requireIptables returns the path of iptables, or skips t where it cannot be used (not
// installed, not root); in CI (CI=true or SLUICE_REQUIRE_BROKER=1, as .ci/run sets) that
// is a failure, not a skip.
func requireIptables(t *testing.T) string {
	t.Helper()
	miss := func(reason string) {
		t.Helper()
		if os.Getenv("CI") == "true" || os.Getenv("SLUICE_REQUIRE_BROKER") == "1" {
			t.Fatalf("the partition scenario needs iptables: %s (CI=true or SLUICE_REQUIRE_BROKER=1; .ci/run installs the Debian package)", reason)
		}
		t.Skipf("the partition scenario needs iptables: %s; set SLUICE_REQUIRE_BROKER=1 to make this a failure", reason)
	}
	path, err := exec.LookPath("iptables")
	if err != nil {
		miss(fmt.Sprintf("not found: %v (apt-get install -y iptables)", err))
	}
	if os.Geteuid() != 0 {
		miss(fmt.Sprintf("changing the firewall needs root (euid %d)", os.Geteuid()))
	}
	if out, err := exec.Command(path, "-S", "OUTPUT").CombinedOutput(); err != nil {
		miss(fmt.Sprintf("iptables -S OUTPUT: %v: %s", err, out))
	}
	return path
}

// firewall runs iptables commands.
type firewall struct {
	t    *testing.T
	path string
}

func (f firewall) run(args ...string) (string, error) {
	out, err := exec.Command(f.path, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// removeChain deletes chain and every jump to it from INPUT and OUTPUT; a chain that does
// not exist is no error.
func (f firewall) removeChain(chain string) error {
	for _, builtin := range []string{"INPUT", "OUTPUT"} {
		rules, err := f.run("-S", builtin)
		if err != nil {
			return err
		}
		for _, rule := range strings.Split(rules, "\n") {
			fields := strings.Fields(rule)
			if len(fields) < 2 || fields[0] != "-A" || !strings.HasSuffix(rule, "-j "+chain) {
				continue
			}
			fields[0] = "-D"
			if _, err := f.run(fields...); err != nil {
				return err
			}
		}
	}
	if _, err := f.run("-S", chain); err != nil {
		return nil // no such chain
	}
	if _, err := f.run("-F", chain); err != nil {
		return err
	}
	_, err := f.run("-X", chain)
	return err
}

// removeStaleChains removes the chains of earlier runs whose process is gone (a test
// killed before its cleanup): they would still cut nodes that no longer exist, and their
// ports may be reused.
func (f firewall) removeStaleChains() {
	f.t.Helper()
	rules, err := f.run("-S")
	require.NoError(f.t, err)
	for _, rule := range strings.Split(rules, "\n") {
		fields := strings.Fields(rule)
		if len(fields) != 2 || fields[0] != "-N" || !strings.HasPrefix(fields[1], chainPrefix) {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimPrefix(fields[1], chainPrefix))
		if err == nil && pid != os.Getpid() && syscall.Kill(pid, 0) == nil {
			continue // another live test process's partition
		}
		f.t.Logf("removing stale iptables chain %s", fields[1])
		require.NoError(f.t, f.removeChain(fields[1]))
	}
}

// cut is a partition: a chain of its own, jumped to from INPUT and OUTPUT for loopback
// traffic, dropping the TCP segments its rules match.
type cut struct {
	fw    firewall
	chain string
	rules [][]string
	on    bool
}

// apply creates the chain with the rules and then the jumps to it; the rules take effect
// on established connections too (no conntrack state is consulted).
func (c *cut) apply() {
	c.fw.t.Helper()
	require.NoError(c.fw.t, c.fw.removeChain(c.chain))
	_, err := c.fw.run("-N", c.chain)
	require.NoError(c.fw.t, err)
	c.on = true
	for _, r := range c.rules {
		_, err := c.fw.run(append([]string{"-A", c.chain}, r...)...)
		require.NoError(c.fw.t, err)
	}
	_, err = c.fw.run("-I", "INPUT", "1", "-i", "lo", "-j", c.chain)
	require.NoError(c.fw.t, err)
	_, err = c.fw.run("-I", "OUTPUT", "1", "-o", "lo", "-j", c.chain)
	require.NoError(c.fw.t, err)
}

// heal removes the jumps and the chain. It is idempotent: the test heals, and its
// cleanup heals again whatever happened.
func (c *cut) heal() error {
	if !c.on {
		return nil
	}
	if err := c.fw.removeChain(c.chain); err != nil {
		return err
	}
	c.on = false
	return nil
}

// portRange returns the first port of n consecutive ports within [lo, hi) that are all
// free to bind on 127.0.0.1 now, starting at a random-ish offset (the process id) so that
// concurrent runs do not pick the same.
func portRange(t *testing.T, lo, hi, n int) int {
	t.Helper()
	span := (hi - lo) / n
	for i := 0; i < span; i++ {
		base := lo + ((os.Getpid()+i*7919)%span)*n
		if rangeFree(base, n) {
			return base
		}
	}
	t.Fatalf("no %d free consecutive ports in [%d, %d)", n, lo, hi)
	return 0
}

func rangeFree(base, n int) bool {
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		_ = l.Close()
	}
	return true
}

// localPortRange reads net.ipv4.ip_local_port_range, the ephemeral ports.
func localPortRange(t *testing.T) (lo, hi int) {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	require.NoError(t, err)
	f := strings.Fields(string(b))
	require.Len(t, f, 2, "ip_local_port_range: %q", b)
	lo, _ = strconv.Atoi(f[0])
	hi, _ = strconv.Atoi(f[1])
	return lo, hi
}

// tcpConn is an established TCP connection on 127.0.0.1 seen from one end.
type tcpConn struct {
	local, remote int // ports
	inode         string
}

// establishedConns reads /proc/net/tcp: the machine's established IPv4 connections.
func establishedConns(t *testing.T) []tcpConn {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	require.NoError(t, err)
	var out []tcpConn
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		if len(f) < 10 || f[3] != "01" {
			continue
		}
		port := func(addr string) int {
			i := strings.LastIndex(addr, ":")
			p, _ := strconv.ParseInt(addr[i+1:], 16, 32)
			return int(p)
		}
		out = append(out, tcpConn{local: port(f[1]), remote: port(f[2]), inode: f[9]})
	}
	return out
}

// socketInodes returns the inodes of the sockets process pid holds.
func socketInodes(t *testing.T, pid int) map[string]bool {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err, "sockets of pid %d", pid)
	out := map[string]bool{}
	for _, e := range entries {
		target, err := os.Readlink(dir + "/" + e.Name())
		if err == nil && strings.HasPrefix(target, "socket:[") {
			out[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] = true
		}
	}
	return out
}
