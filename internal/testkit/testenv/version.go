package testenv

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The RabbitMQ versions the tests run on (SLUICE_RABBITMQ).
const (
	// RabbitMQ310 is the machine's own RabbitMQ (Debian 12's 3.10): the shared node on
	// 5672 and extra nodes started from the host's rabbitmq-server.
	RabbitMQ310 = "3.10"
	// RabbitMQ43 is RabbitMQ 4.3 from the Debian sid chroot scripts/rabbitmq4.sh makes:
	// the shared node make test starts there (AMQP_URL) and extra nodes started from it.
	RabbitMQ43 = "4.3"
)

// Version returns the RabbitMQ version the tests use, from SLUICE_RABBITMQ (3.10 when
// unset). Every test that starts a node of its own, runs rabbitmqctl or enables a plugin
// does so on a node of this version.
func Version() string {
	if v := os.Getenv("SLUICE_RABBITMQ"); v != "" {
		return v
	}
	return RabbitMQ310
}

// Is43 reports whether the tests run on RabbitMQ 4.3.
func Is43() bool { return Version() == RabbitMQ43 }

// Require43 skips t unless the tests run on RabbitMQ 4.3: the test proves a 4.3 behaviour
// (make test runs it in its 4.3 part).
func Require43(t testing.TB) {
	t.Helper()
	if !Is43() {
		t.Skipf("RabbitMQ 4.3 behaviour: runs with SLUICE_RABBITMQ=4.3 (make test's 4.3 part); this run uses %s", Version())
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, l.wrap[0], "mount").CombinedOutput(); err != nil {
		return l, fmt.Errorf("scripts/rabbitmq4.sh mount: %v: %s", err, out)
	}
	return l, nil
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

// SharedNode43 is the node name of the shared 4.3 node make test starts (scripts/test.sh).
const SharedNode43 = "sluice43"

// Ctl runs rabbitmqctl against the shared node of the tests' version (the machine's
// node for 3.10, SharedNode43 in the chroot for 4.3) and returns its output; it skips t
// (fails it under SLUICE_REQUIRE_BROKER=1) when there is no rabbitmqctl to run, and fails
// it when the command fails.
func Ctl(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var cmd *exec.Cmd
	if Is43() {
		l, err := rabbitmq4()
		if err != nil {
			missing(t, "RabbitMQ 4.3's rabbitmqctl: %v", err)
		}
		full := append([]string{"-n", SharedNode43 + "@" + shortHostname()}, args...)
		cmd = l.command(ctx, l.ctl, full...)
	} else {
		path, err := exec.LookPath("rabbitmqctl")
		if err != nil {
			missing(t, "rabbitmqctl not found: %v", err)
		}
		cmd = exec.CommandContext(ctx, path, args...)
	}
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
