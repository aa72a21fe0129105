package testenv

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/mask"
)

// The RabbitMQ series the tests run on.
const (
	// RabbitMQ310 is the machine's RabbitMQ (Debian 12's rabbitmq-server package, 3.10):
	// the node make test starts from it (scripts/rabbitmq310.sh) and extra nodes.
	RabbitMQ310 = "3.10"
	// RabbitMQ43 is RabbitMQ 4.3 from the Debian sid chroot scripts/rabbitmq4.sh makes:
	// the node make test starts there (AMQP_URL) and extra nodes started from it.
	RabbitMQ43 = "4.3"
)

var (
	versionOnce sync.Once
	version     string
	versionErr  error
)

// Version returns the version of the RabbitMQ node the tests use (AMQP_URL, else
// DefaultAMQPURL) as the node reports it when a connection opens ("4.3.6"), read once per
// test process. When no node answers it returns the series SLUICE_RABBITMQ claims (3.10
// when unset); the tests that need the node skip or fail on their own.
//
// SLUICE_RABBITMQ claims the series a run is labelled with (make test sets it for each
// part). When the node is of another series, Version panics naming the version found: a
// run labelled 4.3 must not test another version and say it tested 4.3.
func Version() string {
	versionOnce.Do(func() {
		u := os.Getenv("AMQP_URL")
		if u == "" {
			u = DefaultAMQPURL
		}
		version, versionErr = BrokerVersion(u, 3*time.Second)
	})
	claimed := os.Getenv("SLUICE_RABBITMQ")
	if versionErr != nil {
		if claimed != "" {
			return claimed
		}
		return RabbitMQ310
	}
	if claimed != "" && SeriesOf(version) != claimed {
		u := os.Getenv("AMQP_URL")
		if u == "" {
			u = DefaultAMQPURL
		}
		panic(fmt.Sprintf("testenv: the RabbitMQ node at %s is %s, not %s.x as SLUICE_RABBITMQ=%s claims: the run would be labelled with a version it does not test",
			mask.Credentials(u), version, claimed, claimed))
	}
	return version
}

// Series returns the major.minor of Version: "4.3" or "3.10". Every test that starts a
// node of its own, runs rabbitmqctl or enables a plugin does so on a node of this series.
func Series() string { return SeriesOf(Version()) }

// Is43 reports whether the tests run on RabbitMQ 4.3.
func Is43() bool { return Series() == RabbitMQ43 }

// Require43 skips t unless the tests run on RabbitMQ 4.3: the test proves a 4.3 behaviour
// (make test runs it in its 4.3 part).
func Require43(t testing.TB) {
	t.Helper()
	if !Is43() {
		t.Skipf("RabbitMQ 4.3 behaviour: runs on a 4.3 node (make test's 4.3 part); this run uses %s", Version())
	}
}

// launcher runs a RabbitMQ program of the tests' version: the host's, or the chroot's
// through scripts/rabbitmq4.sh run.
type launcher struct {
	// wrap is the command prefix ([] on the host, [script, "run"] for the chroot).
	wrap []string
	// server and ctl are rabbitmq-server and rabbitmqctl (paths on the host).
	server, ctl string
	// root is the chroot's path on the host, "" on the host.
	root string
	// uid and gid own a node's directory.
	uid, gid int
}

// command returns the command running program with args.
func (l launcher) command(ctx context.Context, program string, args ...string) *exec.Cmd {
	all := append(append(append([]string{}, l.wrap...), program), args...)
	return exec.CommandContext(ctx, all[0], all[1:]...)
}

// inside returns the path a host path has for the node (inside the chroot).
func (l launcher) inside(p string) string {
	if l.root == "" {
		return p
	}
	return "/" + strings.TrimPrefix(strings.TrimPrefix(p, l.root), "/")
}

// tempRoot is where node directories are made: a folder the node can reach.
func (l launcher) tempRoot() string {
	if l.root == "" {
		return ""
	}
	return filepath.Join(l.root, "tmp")
}

var (
	chrootOnce sync.Once
	chroot     launcher
	chrootErr  error
)

// rabbitmq4 returns the launcher of the 4.3 chroot, made (once, cached) and mounted.
// It mounts on every call, not once: a node's cleanup unmounts the chroot when it was the
// last node running there (releaseChroot), and the next node of the same test binary
// would otherwise boot without /proc (RabbitMQ's memory monitor fails, "BOOT FAILED").
func rabbitmq4() (launcher, error) {
	l, err := chrootLauncher()
	if err != nil {
		return l, err
	}
	if mounted(filepath.Join(l.root, "proc"), filepath.Join(l.root, "dev"), filepath.Join(l.root, "sys")) {
		return l, nil // the usual case in make test, whose own 4.3 node keeps them mounted
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, l.wrap[0], "mount").CombinedOutput(); err != nil {
		return l, fmt.Errorf("scripts/rabbitmq4.sh mount: %v: %s", err, out)
	}
	return l, nil
}

// mounted reports whether every path is a mount point (in /proc/self/mountinfo).
func mounted(paths ...string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	points := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			points[f[4]] = true
		}
	}
	for _, p := range paths {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if !points[p] {
			return false
		}
	}
	return true
}

// chrootLauncher makes the 4.3 chroot (once, cached) and returns its launcher.
func chrootLauncher() (launcher, error) {
	chrootOnce.Do(func() {
		_, file, _, ok := runtime.Caller(0)
		if !ok {
			chrootErr = fmt.Errorf("cannot locate the module root")
			return
		}
		root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
		script := filepath.Join(root, "scripts", "rabbitmq4.sh")
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, script, "ensure").CombinedOutput(); err != nil {
			chrootErr = fmt.Errorf("scripts/rabbitmq4.sh ensure: %v: %s", err, out)
			return
		}
		out, err := exec.CommandContext(ctx, script, "root").Output()
		if err != nil {
			chrootErr = fmt.Errorf("scripts/rabbitmq4.sh root: %v", err)
			return
		}
		l := launcher{wrap: []string{script, "run"}, server: "rabbitmq-server", ctl: "rabbitmqctl", root: strings.TrimSpace(string(out))}
		l.uid, l.gid, chrootErr = passwdUser(filepath.Join(l.root, "etc", "passwd"), "rabbitmq")
		chroot = l
	})
	return chroot, chrootErr
}

// passwdUser returns name's uid and gid in a passwd file.
func passwdUser(path, name string) (uid, gid int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Split(s.Text(), ":")
		if len(fields) > 3 && fields[0] == name {
			uid, _ = strconv.Atoi(fields[2])
			gid, _ = strconv.Atoi(fields[3])
			return uid, gid, nil
		}
	}
	return 0, 0, fmt.Errorf("no user %q in %s", name, path)
}

// releaseChroot unmounts the chroot when no node runs there any more.
func releaseChroot() {
	if chroot.root == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = exec.CommandContext(ctx, chroot.wrap[0], "release").Run()
}

// SharedNode43 is the name of the 4.3 node at AMQP_URL when SLUICE_RABBITMQ_NODE does not
// name it: the one `scripts/rabbitmq4.sh start sluice43 5673` starts for development.
const SharedNode43 = "sluice43"

// sharedNode is the full name of the node at AMQP_URL for rabbitmqctl -n: SLUICE_RABBITMQ_NODE
// (make test names the node it started), else SharedNode43 on 4.3, else "" (rabbitmqctl's
// default node, the machine's).
func sharedNode() string {
	if n := os.Getenv("SLUICE_RABBITMQ_NODE"); n != "" {
		return n
	}
	if Is43() {
		return SharedNode43 + "@" + shortHostname()
	}
	return ""
}

// hostLauncher runs the host's RabbitMQ programs: through SLUICE_RABBITMQ_RUN when set
// (make test sets "scripts/rabbitmq310.sh run", which runs them with its nodes' cookie and
// port mapper), else as they are installed.
func hostLauncher() (launcher, error) {
	var l launcher
	l.uid, l.gid = -1, -1
	if u, err := user.Lookup("rabbitmq"); err == nil {
		l.uid, _ = strconv.Atoi(u.Uid)
		l.gid, _ = strconv.Atoi(u.Gid)
	}
	if wrap := strings.Fields(os.Getenv("SLUICE_RABBITMQ_RUN")); len(wrap) > 0 {
		l.wrap, l.server, l.ctl = wrap, "rabbitmq-server", "rabbitmqctl"
		return l, nil
	}
	var err error
	if l.server, err = exec.LookPath("rabbitmq-server"); err != nil {
		return l, fmt.Errorf("rabbitmq-server not found: %w", err)
	}
	if l.ctl, err = exec.LookPath("rabbitmqctl"); err != nil {
		return l, fmt.Errorf("rabbitmqctl not found: %w", err)
	}
	return l, nil
}

// Ctl runs rabbitmqctl against the node at AMQP_URL (SLUICE_RABBITMQ_NODE; without it the
// machine's node on 3.10 and SharedNode43 in the chroot on 4.3) and returns its output; it
// skips t (fails it under SLUICE_REQUIRE_BROKER=1) when there is no rabbitmqctl to run, and
// fails it when the command fails.
func Ctl(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var l launcher
	var err error
	if Is43() {
		if l, err = rabbitmq4(); err != nil {
			missing(t, "RabbitMQ 4.3's rabbitmqctl: %v", err)
		}
	} else if l, err = hostLauncher(); err != nil {
		missing(t, "%v", err)
	}
	full := args
	if node := sharedNode(); node != "" {
		full = append([]string{"-n", node}, args...)
	}
	cmd := l.command(ctx, l.ctl, full...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %s (RabbitMQ %s): %v: %s", strings.Join(args, " "), Version(), err, out)
	}
	return string(out)
}

// missing skips t, or fails it under SLUICE_REQUIRE_BROKER=1.
func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if os.Getenv("SLUICE_REQUIRE_BROKER") == "1" {
		t.Fatalf("%s (SLUICE_REQUIRE_BROKER=1)", reason)
	}
	t.Skipf("%s; set SLUICE_REQUIRE_BROKER=1 to make this a failure", reason)
}

// LargeMessageBytes is the size of the largest payload the tests send to show how sluice
// handles a huge message: 20 MiB, or less where the broker refuses that. RabbitMQ 4.x
// lowered max_message_size's default from 128 MiB to 16 MiB (a larger publish is refused
// with a nack, which sluice returns as a publish error); the tests stay under it with room
// for sluice's failure record.
func LargeMessageBytes() int {
	if Is43() {
		return 15 << 20
	}
	return 20 << 20
}
