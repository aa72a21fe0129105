// Package cluster tests sluice on a three-node RabbitMQ cluster that it starts on this
// machine with scripts/rabbitmq-cluster.sh, beside the shared node (which it never
// touches): key-partitioned consumption by several instances of the payments service,
// instance and node failures, client failover between nodes.
//
// The cluster starts with the first test that needs it and stops when the package ends,
// unless another test process still uses it (SLUICE_CLUSTER_KEEP=1 leaves it running for
// the next run, which then starts at once).
// Where it cannot start, the tests skip, or fail under SLUICE_REQUIRE_BROKER=1.
package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// clusterState is the cluster this package started, once.
var clusterState struct {
	once      sync.Once
	started   bool
	urls      []string
	startTime time.Duration
	startLog  string
	err       error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if clusterState.started && os.Getenv("SLUICE_CLUSTER_KEEP") != "1" {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		out, err := scriptCmd(ctx, "stop").CombinedOutput()
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "cluster: stopping the cluster failed: %v\n%s", err, out)
		}
	}
	os.Exit(code)
}

// script is scripts/rabbitmq-cluster.sh of this checkout.
func script() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "scripts", "rabbitmq-cluster.sh")
}

// scriptCmd runs the script as this process's user of the cluster: a stop leaves the
// cluster running while another test process that started it too is still alive.
func scriptCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, script(), args...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("SLUICE_CLUSTER_USER=%d", os.Getpid()))
	return cmd
}

// nodeURLs returns the AMQP URLs of the cluster's three nodes, starting the cluster on
// first use; it skips t when the cluster cannot start (fails it under
// SLUICE_REQUIRE_BROKER=1).
func nodeURLs(t *testing.T) []string {
	t.Helper()
	clusterState.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		begin := time.Now()
		out, err := scriptCmd(ctx, "start").CombinedOutput()
		clusterState.startLog = string(out)
		// Whatever happened, stop what may have started.
		clusterState.started = true
		if err != nil {
			clusterState.err = fmt.Errorf("scripts/rabbitmq-cluster.sh start: %v\n%s", err, out)
			return
		}
		clusterState.startTime = time.Since(begin)
		urls, err := exec.CommandContext(ctx, script(), "urls").Output()
		if err != nil {
			clusterState.err = fmt.Errorf("scripts/rabbitmq-cluster.sh urls: %v", err)
			return
		}
		clusterState.urls = strings.Split(strings.TrimSpace(string(urls)), ",")
	})
	if clusterState.err != nil {
		if os.Getenv("SLUICE_REQUIRE_BROKER") == "1" {
			t.Fatalf("the local RabbitMQ cluster is required (SLUICE_REQUIRE_BROKER=1): %v", clusterState.err)
		}
		t.Skipf("the local RabbitMQ cluster did not start; set SLUICE_REQUIRE_BROKER=1 to make this a failure: %v", clusterState.err)
	}
	return append([]string(nil), clusterState.urls...)
}

// ctl runs rabbitmqctl against node n (1..3) through the script, which knows the user and
// the cookie, and returns its output.
func ctl(t *testing.T, n int, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, script(), append([]string{"ctl", fmt.Sprint(n)}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl -n node%d %s: %v\n%s", n, strings.Join(args, " "), err, out)
	}
	return string(out)
}
