package testenv

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// NodeOptions configure an extra RabbitMQ node started for one test (StartNode). The shared
// node on 5672 is never touched: an extra node has its own name, ports, data and logs in a
// directory of its own. Cluster tests start several with the same Host and join them with
// Ctl("join_cluster", ...).
type NodeOptions struct {
	// Name is the node's short name, before the "@". Empty means "sluice_" and a random
	// suffix; a given name gets no suffix, so it must be unique on the machine.
	Name string
	// Host is the node's host part. Empty means the machine's short host name (what
	// `hostname -s` prints), which every node on the machine shares.
	Host string
	// Port is the plain AMQP listener's port, on 127.0.0.1. Zero means a free port.
	Port int
	// DistPort is the Erlang distribution port, on 127.0.0.1. Zero means a free port.
	DistPort int
	// Config holds extra rabbitmq.conf lines (listeners.ssl.*, ssl_options.*,
	// cluster_formation.*, ...). "{dir}" in a line becomes the node's directory, where
	// Files are.
	Config []string
	// Files are written into the node's directory before it starts, readable by the node
	// only: certificates, keys, definitions. Names are relative to the directory.
	Files map[string][]byte
	// Env holds extra environment variables for rabbitmq-server.
	Env map[string]string
	// Plugins are the plugins to enable. Empty means none (no management listener).
	Plugins []string
	// StartTimeout bounds one start, until the node has booted. Zero means 90s.
	StartTimeout time.Duration
}

// Node is an extra RabbitMQ node started by StartNode.
type Node struct {
	t testing.TB
	// Name is the full node name, name@host, for `rabbitmqctl -n`.
	Name string
	// Port is the plain AMQP port on 127.0.0.1.
	Port int
	// DistPort is the Erlang distribution port.
	DistPort int
	// Dir is the node's directory: its config, Files, data (mnesia/) and logs (log/).
	Dir string
	// StartTime is how long the last start took, from launch to a booted node.
	StartTime time.Duration
	// Version is the RabbitMQ version the node wrote in its log as it booted ("4.3.6").
	Version string

	env     []string
	run     launcher
	timeout time.Duration

	mu      sync.Mutex
	running bool
}

// StartNode starts an extra RabbitMQ node and waits until it has booted; it is stopped,
// and its directory removed, when t ends. StartNode skips t where the node cannot be
// run (no rabbitmq-server or rabbitmqctl, not root, no broker reachable), or fails it when
// SLUICE_REQUIRE_BROKER=1, like AMQPURL.
func StartNode(t testing.TB, opts NodeOptions) *Node {
	t.Helper()
	n := newNode(t, nodePrerequisites(t), opts)
	if err := n.Start(); err != nil {
		t.Fatalf("%v", err)
	}
	return n
}

// nodePrerequisites returns how to run a node of the tests' version (Version), or skips
// (fails under SLUICE_REQUIRE_BROKER=1) when an extra node cannot be run here.
func nodePrerequisites(t testing.TB) launcher {
	t.Helper()
	miss := func(format string, args ...any) {
		t.Helper()
		missing(t, "cannot start an extra RabbitMQ "+Version()+" node: "+format, args...)
	}
	if os.Geteuid() != 0 {
		miss("the node must run as the rabbitmq user, which needs root (euid %d)", os.Geteuid())
	}
	if Is43() {
		l, err := rabbitmq4()
		if err != nil {
			miss("%v", err)
		}
		return l
	}
	l, err := hostLauncher()
	if err != nil {
		miss("%v", err)
	}
	return l
}

// prepare writes the node's configuration and files and builds its environment.
func (n *Node) prepare(opts NodeOptions) {
	t := n.t
	t.Helper()
	for _, sub := range []string{"mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, sub), 0o750); err != nil {
			t.Fatalf("node %s: %v", n.Name, err)
		}
	}
	conf := []string{
		"listeners.tcp.1 = 127.0.0.1:" + strconv.Itoa(n.Port),
		"loopback_users.guest = true",
		"log.console = false",
		"log.file.level = info",
	}
	for _, line := range opts.Config {
		conf = append(conf, strings.ReplaceAll(line, "{dir}", n.run.inside(n.Dir)))
	}
	plugins := "[" + strings.Join(opts.Plugins, ",") + "]."
	files := map[string][]byte{
		"rabbitmq.conf": []byte(strings.Join(conf, "\n") + "\n"),
		// An empty env file of its own, so the machine's rabbitmq-env.conf (which names
		// the shared node) does not apply.
		"rabbitmq-env.conf": nil,
		"advanced.config":   []byte("[].\n"),
		"enabled_plugins":   []byte(plugins + "\n"),
	}
	for name, b := range opts.Files {
		files[name] = b
	}
	for name, b := range files {
		p := filepath.Join(n.Dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatalf("node %s: %v", n.Name, err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatalf("node %s: write %s: %v", n.Name, name, err)
		}
	}
	if err := chownTo(n.Dir, n.run.uid, n.run.gid); err != nil {
		t.Fatalf("node %s: %v", n.Name, err)
	}

	dir := n.run.inside(n.Dir) // where the node sees its directory
	env := map[string]string{
		"RABBITMQ_NODENAME":             n.Name,
		"RABBITMQ_NODE_IP_ADDRESS":      "127.0.0.1",
		"RABBITMQ_NODE_PORT":            strconv.Itoa(n.Port),
		"RABBITMQ_DIST_PORT":            strconv.Itoa(n.DistPort),
		"RABBITMQ_MNESIA_BASE":          filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE":             filepath.Join(dir, "log"),
		"RABBITMQ_PID_FILE":             n.run.inside(n.pidFile()),
		"RABBITMQ_CONFIG_FILE":          filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE": filepath.Join(dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE":        filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE": filepath.Join(dir, "enabled_plugins"),
		"ERL_EPMD_ADDRESS":              "127.0.0.1",
		// Erlang distribution on loopback only, as the shared node's.
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
	}
	for k, v := range opts.Env {
		env[k] = v
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	n.env = os.Environ()
	for _, k := range keys {
		n.env = append(n.env, k+"="+env[k])
	}
}

func (n *Node) pidFile() string { return filepath.Join(n.Dir, "mnesia", "node.pid") }

// chownTo gives dir and everything in it to uid:gid (the rabbitmq user the node runs as);
// a negative uid leaves them as they are.
func chownTo(dir string, uid, gid int) error {
	if uid < 0 {
		return nil // no rabbitmq user: the node runs as whoever starts it
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		return err
	}
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// Start starts the node (again, after Stop, with the same data) and waits until it has
// booted. The error carries the end of the node's log.
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.running {
		return nil
	}
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), n.timeout)
	defer cancel()
	// The boot is read from the node's own log, from where it ends now (a restart appends).
	logPath := n.logPath()
	var offset int64
	if fi, err := os.Stat(logPath); err == nil {
		offset = fi.Size()
	}
	_ = os.Remove(n.pidFile()) // a pid file left by the last run would name a dead process
	cmd := n.run.command(ctx, n.run.server, "-detached")
	cmd.Env = n.env
	cmd.Dir = n.Dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("start node %s: %v: %s\n%s", n.Name, err, out, n.LogTail(40))
	}
	// Mark it running now: whatever happens next, Stop must try to stop it.
	n.running = true
	if err := n.awaitBoot(ctx, logPath, offset); err != nil {
		return fmt.Errorf("node %s did not boot within %s: %v\n%s", n.Name, n.timeout, err, n.LogTail(40))
	}
	n.StartTime = time.Since(begin)
	// The version the node itself says it runs, in the run's output (testsummary lists
	// every node a run started), and of the series the tests run on.
	n.Version = LoggedVersion(filepath.Join(n.Dir, "log"))
	n.t.Logf("testenv: started RabbitMQ %s node %s on 127.0.0.1:%d in %s", n.Version, n.Name, n.Port, n.StartTime.Round(100*time.Millisecond))
	if want := Series(); SeriesOf(n.Version) != want {
		return fmt.Errorf("node %s is RabbitMQ %q, not %s.x, the series the tests run on (its log: %s)", n.Name, n.Version, want, filepath.Join(n.Dir, "log"))
	}
	return nil
}

// awaitBoot waits until the node's log, past offset, says its boot completed ("Server
// startup complete", the line RabbitMQ writes once its listeners and plugins run, when
// `rabbitmqctl wait` would return too), without the second or two an Erlang VM for
// rabbitmqctl costs. It fails as soon as the log says the boot failed or the node's
// process, once its pid file names it, is gone.
func (n *Node) awaitBoot(ctx context.Context, logPath string, offset int64) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if tail := readFrom(logPath, offset); tail != "" {
			switch {
			case strings.Contains(tail, "Server startup complete"):
				return nil
			case strings.Contains(tail, "BOOT FAILED"):
				return fmt.Errorf("its log says BOOT FAILED")
			}
		}
		if pid := n.pid(); pid > 0 && !processAlive(pid) {
			return fmt.Errorf("its process (pid %d) ended during the boot", pid)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// readFrom returns the file at path from offset on, or "" when it cannot be read.
func readFrom(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// logPath is the node's main log: log/<name>@<host>.log.
func (n *Node) logPath() string { return filepath.Join(n.Dir, "log", n.Name+".log") }

// Stop stops the node and waits for its process to end; a node that does not stop is
// killed. Stopping a stopped node does nothing.
func (n *Node) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.running {
		return
	}
	n.running = false
	pid := n.pid()
	if pid > 0 && processAlive(pid) {
		// SIGTERM is an orderly shutdown (the Erlang VM runs init:stop(), as rabbitmqctl
		// stop does), without the Erlang VM rabbitmqctl would start first.
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			n.t.Logf("node %s: SIGTERM %d: %v", n.Name, pid, err)
		}
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if out, err := n.ctlContext(ctx, "stop"); err != nil {
			n.t.Logf("rabbitmqctl -n %s stop: %v: %s", n.Name, err, out)
		}
	}
	if pid <= 0 {
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			n.t.Logf("node %s (pid %d) did not stop; killing it", n.Name, pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (n *Node) pid() int {
	b, err := os.ReadFile(n.pidFile())
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// processAlive reports whether pid runs: a zombie (ended, not yet reaped by its parent,
// which for a detached node is init) does not.
func processAlive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no /proc to ask: kill's answer stands
	}
	// "pid (comm) S ...": the state follows the command's closing parenthesis.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z'
	}
	return true
}

// Ctl runs `rabbitmqctl -n <node> args...` and returns its combined output.
func (n *Node) Ctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return n.ctlContext(ctx, args...)
}

func (n *Node) ctlContext(ctx context.Context, args ...string) (string, error) {
	cmd := n.run.command(ctx, n.run.ctl, append([]string{"-n", n.Name}, args...)...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.String(), err
}

// URL returns the node's plain AMQP URL for the default guest user (allowed from
// loopback only, which is where the node listens).
func (n *Node) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.Port) }

// Rabbit connects a plain client (see Rabbit) to the node's AMQP port; it is closed when t
// ends.
func (n *Node) Rabbit(t testing.TB) *Rabbit {
	t.Helper()
	conn, err := amqp.Dial(n.URL())
	if err != nil {
		t.Fatalf("connect plain client to node %s: %v", n.Name, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &Rabbit{t: t, URL: n.URL(), Conn: conn}
}

// LogTail returns the last lines of the node's log, for failure messages.
func (n *Node) LogTail(lines int) string {
	all := n.logLines()
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return "node log (last lines):\n" + strings.Join(all, "\n")
}

// LogMatching returns the last lines of the node's log that contain substr, at most
// lines of them, for failure messages about one subsystem the tail may have scrolled past.
func (n *Node) LogMatching(substr string, lines int) string {
	var found []string
	for _, l := range n.logLines() {
		if strings.Contains(l, substr) {
			found = append(found, l)
		}
	}
	if len(found) > lines {
		found = found[len(found)-lines:]
	}
	return fmt.Sprintf("node log lines with %q (%d shown):\n%s", substr, len(found), strings.Join(found, "\n"))
}

// logLines reads the node's main log.
func (n *Node) logLines() []string {
	name := strings.SplitN(n.Name, "@", 2)[0]
	matches, _ := filepath.Glob(filepath.Join(n.Dir, "log", name+"@*.log"))
	var b []byte
	for _, m := range matches {
		if strings.HasSuffix(m, "_upgrade.log") {
			continue
		}
		b, _ = os.ReadFile(m)
	}
	return strings.Split(strings.TrimRight(string(b), "\n"), "\n")
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// shortHostname is `hostname -s`: the host name up to its first dot.
func shortHostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "localhost"
	}
	return strings.SplitN(h, ".", 2)[0]
}
