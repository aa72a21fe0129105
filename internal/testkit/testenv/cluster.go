package testenv

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// StartCluster starts one node per entry of opts, at the same time (a node's boot is
// mostly waiting), and joins every node after the first to the first, one after the other
// (concurrent joins race on the schema). Each node is stopped and its directory removed
// when t ends, as with StartNode. Entries must give distinct names or leave them empty.
func StartCluster(t testing.TB, opts ...NodeOptions) []*Node {
	t.Helper()
	run := nodePrerequisites(t)
	nodes := make([]*Node, len(opts))
	for i, o := range opts {
		nodes[i] = newNode(t, run, o)
	}
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.Start()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("%v", err)
		}
	}
	for _, n := range nodes[1:] {
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", nodes[0].Name}, {"start_app"}} {
			if out, err := n.Ctl(args...); err != nil {
				t.Fatalf("node %s: rabbitmqctl %s: %v: %s\n%s", n.Name, strings.Join(args, " "), err, out, n.LogTail(30))
			}
		}
	}
	return nodes
}

// newNode names a node, makes its directory and writes its files, without starting it;
// its Stop and the directory's removal are registered on t.
func newNode(t testing.TB, run launcher, opts NodeOptions) *Node {
	t.Helper()
	n := &Node{t: t, run: run, timeout: opts.StartTimeout}
	if n.timeout <= 0 {
		n.timeout = 90 * time.Second
	}
	name := opts.Name
	if name == "" {
		name = fmt.Sprintf("sluice_%06d", rand.IntN(1e6))
	}
	host := opts.Host
	if host == "" {
		host = shortHostname()
	}
	n.Name = name + "@" + host
	n.Port = opts.Port
	if n.Port == 0 {
		n.Port = FreePort(t)
	}
	n.DistPort = opts.DistPort
	if n.DistPort == 0 {
		n.DistPort = FreePort(t)
	}
	dir, err := os.MkdirTemp(run.tempRoot(), "sluice-node-")
	if err != nil {
		t.Fatalf("node %s: make directory: %v", n.Name, err)
	}
	n.Dir = dir
	t.Cleanup(func() {
		n.Stop()
		_ = os.RemoveAll(dir)
		releaseChroot()
	})
	n.prepare(opts)
	return n
}
