//go:build faults

package faults

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// AMQP 0-9-1 basic methods (class 60) a consumer settles deliveries with.
const (
	basicAck    = 80
	basicReject = 90
	basicNack   = 120
)

// sniffer is a TCP proxy that reads the AMQP frames a client sends and counts the
// settlement methods among them.
type sniffer struct {
	ln      net.Listener
	target  string
	methods sync.Map // method id -> *atomic.Int64
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
	once    sync.Once
}

func newSniffer(t *testing.T, target string) *sniffer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &sniffer{ln: ln, target: target}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.close)
	return s
}

func (s *sniffer) url() string { return "amqp://guest:guest@" + s.ln.Addr().String() + "/" }

func (s *sniffer) count(method uint16) int64 {
	v, _ := s.methods.LoadOrStore(method, new(atomic.Int64))
	return v.(*atomic.Int64).Load()
}

func (s *sniffer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", s.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		s.mu.Lock()
		s.conns = append(s.conns, c, up)
		s.mu.Unlock()
		s.wg.Add(2)
		go func() { defer s.wg.Done(); _, _ = io.Copy(c, up); _ = c.Close() }()
		go func() { defer s.wg.Done(); s.read(c, up); _ = up.Close() }()
	}
}

// read copies the client's bytes upstream, parsing its frames on the way.
func (s *sniffer) read(client net.Conn, up net.Conn) {
	r := bufio.NewReader(io.TeeReader(client, up))
	header := make([]byte, 8) // "AMQP" 0 0 9 1
	if _, err := io.ReadFull(r, header); err != nil {
		return
	}
	frame := make([]byte, 7)
	for {
		if _, err := io.ReadFull(r, frame); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(frame[3:7])
		payload := make([]byte, size+1) // + frame-end
		if _, err := io.ReadFull(r, payload); err != nil {
			return
		}
		if frame[0] == 1 && size >= 4 && binary.BigEndian.Uint16(payload[0:2]) == 60 {
			method := binary.BigEndian.Uint16(payload[2:4])
			v, _ := s.methods.LoadOrStore(method, new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
		}
	}
}

func (s *sniffer) close() {
	s.once.Do(s.shut)
}

func (s *sniffer) shut() {
	_ = s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// brokenDelayer fails every hand-off, so the stack can only give a failing message back.
type brokenDelayer struct{}

var errDelayBroken = errors.New("delay path broken for the test")

func (brokenDelayer) Delay(context.Context, string, time.Duration, *message.Message) error {
	return errDelayBroken
}

// TestRabbitMQ4Semantics is scenario 10: what RabbitMQ 4.x changes, checked on 3.10. On
// the wire (a frame sniffer between sluice and the node), a failed delivery goes back with
// basic.reject (4.x counts it toward a quorum queue's delivery limit) and a shutdown gives
// deliveries back with basic.nack (which it does not count). On the node, every queue
// sluice declares is durable (4.x removes transient non-exclusive queues) and has no
// x-queue-mode (gone in 4.x), and no channel uses global QoS (gone in 4.x). In the code,
// none of these appear and x-death is never read (4.x no longer lets a republished message
// keep it).
func TestRabbitMQ4Semantics(t *testing.T) {
	node := startNode(t)
	base := takeBaseline(t, node)
	sn := newSniffer(t, "127.0.0.1:"+strconv.Itoa(node.Port))

	for _, qt := range []amqp.QueueType{amqp.QueueQuorum, amqp.QueueClassic} {
		t.Run(string(qt), func(t *testing.T) {
			queue := testenv.Name("faults.semantics")
			l := newLedger()
			var gate sync.RWMutex
			st := startStack(t, amqp.Config{URLs: []string{sn.url()}, QueueType: qt, NackBackoffMax: 100 * time.Millisecond},
				router.Config{Retry: retry.Config{Delayer: brokenDelayer{}, MaxRetries: 3}, Concurrency: 1, Prefetch: 10, CloseTimeout: 5 * time.Second},
				gatedWorkload(l, queue, 0, &gate))

			// A failing message whose hand-off fails is given back: reject.
			rejects, nacks := sn.count(basicReject), sn.count(basicNack)
			publishAll(l, st.broker.Publisher(), queue, []string{failOnce + "semantics"}, 1, 1, 10*time.Second)
			require.Eventually(t, func() bool { return sn.count(basicReject) > rejects }, 30*time.Second, 20*time.Millisecond, "a failure goes back with basic.reject")
			require.Eventually(t, func() bool { return l.count(func(r *record) bool { return r.effects > 0 }) == 1 }, 30*time.Second, 20*time.Millisecond, "the retried delivery succeeded")
			assert.Equal(t, nacks, sn.count(basicNack), "no basic.nack for a failure")

			// Global QoS is a channel setting RabbitMQ 3.10 reports. 4.3 has no such setting
			// left to report: it denies global QoS, so a channel asking for it would have
			// failed the stack above (and TestDeclaresNoDeniedFeatureOn43 finds none used).
			if !testenv.Is43() {
				out := ctl(t, node, "-q", "--no-table-headers", "list_channels", "name", "prefetch_count", "global_prefetch_count")
				for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
					f := strings.Fields(line)
					require.GreaterOrEqual(t, len(f), 2, "list_channels line %q", line)
					assert.Equal(t, "0", f[len(f)-1], "global prefetch on channel %s", line)
				}
			}

			// Deliveries held at shutdown go back with basic.nack.
			gate.Lock()
			var ids []string
			for i := 0; i < 5; i++ {
				ids = append(ids, fmt.Sprintf("semantics-%d", i))
			}
			publishAll(l, st.broker.Publisher(), queue, ids, 5, 1, 10*time.Second)
			require.Eventually(t, func() bool { return unacked(t, node, queue) == len(ids) }, 30*time.Second, 50*time.Millisecond, "the consumer holds every delivery")
			rejects, nacks = sn.count(basicReject), sn.count(basicNack)
			closed := make(chan struct{})
			go func() { st.close(); close(closed) }()
			time.Sleep(200 * time.Millisecond) // the stack stops before the handler can finish
			gate.Unlock()
			<-closed
			assert.Greater(t, sn.count(basicNack), nacks, "deliveries given back at shutdown go with basic.nack")
			assert.Equal(t, rejects, sn.count(basicReject), "no basic.reject at shutdown")

			// What sluice declared.
			out := ctl(t, node, "-q", "--no-table-headers", "list_queues", "name", "durable", "exclusive", "arguments")
			declared := 0
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				f := strings.Fields(line)
				if len(f) < 3 {
					continue
				}
				declared++
				assert.True(t, f[1] == "true" || f[2] == "true", "queue %s is transient and not exclusive: %s", f[0], line)
				assert.NotContains(t, line, "x-queue-mode", "queue %s", f[0])
			}
			// The delay cascade is declared as delays need it (this stack's delayer is broken,
			// so none here; TestCascadeDeclaresOnlyTheLevelsItsDelaysReach checks its queues).
			assert.GreaterOrEqual(t, declared, 2, "the queue and its DLQ are listed")
		})
	}
	sn.close()
	base.verify(t)
}

// unacked returns how many deliveries of queue wait for their consumer's ack.
func unacked(t *testing.T, node *testenv.Node, queue string) int {
	out := ctl(t, node, "-q", "--no-table-headers", "list_queues", "name", "messages_unacknowledged")
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == queue {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return -1
}

// forbidden are code patterns RabbitMQ 4.x breaks or removes.
var forbidden = []struct {
	what string
	re   *regexp.Regexp
}{
	{"x-queue-mode (removed in 4.x; classic queues v2 ignore it)", regexp.MustCompile(`"x-queue-mode"`)},
	{"global QoS (removed in 4.x)", regexp.MustCompile(`\.Qos\([^()]*,\s*true\s*\)`)},
	{"a transient non-exclusive queue (removed in 4.x)", regexp.MustCompile(`QueueDeclare\([^,()]+,\s*false,\s*[^,()]+,\s*false\s*,`)},
	{"reading x-death (4.x does not keep it on a republished message)", regexp.MustCompile(`\[\s*"x-death"\s*\]|Get\(\s*"x-death"\s*\)|xDeath`)},
	{"nack without requeue for a failure (dead-letters instead of counting)", regexp.MustCompile(`\.Nack\([^()]*,\s*false\s*\)`)},
}

// TestNo4xBreakingCode scans sluice's code (tests excepted) for what RabbitMQ 4.x breaks.
func TestNo4xBreakingCode(t *testing.T) {
	_, here, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(here), "..", "..")
	scanned := 0
	err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.IsDir() {
			switch info.Name() {
			case ".git", "testdata", "node_modules", ".cache":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		scanned++
		for _, f := range forbidden {
			for _, loc := range f.re.FindAllIndex(b, -1) {
				line := 1 + strings.Count(string(b[:loc[0]]), "\n")
				t.Errorf("%s:%d: %s: %s", p, line, f.what, b[loc[0]:loc[1]])
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, scanned, 50, "sluice's Go files were scanned from %s", root)
	// The patterns must catch what they are for.
	for _, bad := range []string{`ch.Qos(10, 0, true)`, `ch.QueueDeclare(q, false, false, false, false, nil)`, `d.Headers["x-death"]`, `args["x-queue-mode"] = "lazy"`} {
		hit := false
		for _, f := range forbidden {
			hit = hit || f.re.MatchString(bad)
		}
		assert.True(t, hit, "a pattern catches %s", bad)
	}
}
