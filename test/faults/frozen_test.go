//go:build faults

package faults

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// Scenario 8 numbers.
const (
	// frozenPrefetch is the frozen consumer's prefetch: what it can hold unacked when it is
	// stopped, hence the bound on duplicated side effects (its idempotency store is its own).
	frozenPrefetch = 16
	// frozenWork is a handler call's duration in both consumers.
	frozenWork = 50 * time.Millisecond
	// consumerFreeze is the least a consumer stays stopped: past three heartbeats.
	consumerFreeze = 3*serverHeartbeat + time.Second
	// brokerFreeze is how long the node's VM stays stopped.
	brokerFreeze = 40 * time.Second
	// frozenPublishDeadline is the deadline of each publish made around the broker freeze.
	frozenPublishDeadline = 5 * time.Second
)

// TestFrozen is scenario 8 on one node: a consumer process stopped (SIGSTOP) past three
// heartbeats, then the node's own VM stopped for 40 s.
func TestFrozen(t *testing.T) {
	node := startNode(t)
	t.Run("consumer", func(t *testing.T) { testFrozenConsumer(t, node) })
	t.Run("broker", func(t *testing.T) { testFrozenBroker(t, node) })
}

// helper is the frozen consumer's process (test/faults/frozenconsumer).
type helper struct {
	cmd    *exec.Cmd
	stderr testenv.SyncBuffer
	exited chan error
	lines  chan string // stdout lines other than effects
}

// startHelper starts the frozen consumer on queue; its side effects go to l.
func startHelper(t *testing.T, node *testenv.Node, l *ledger, queue string) *helper {
	t.Helper()
	bin := testenv.Binary(t, "./test/faults/frozenconsumer")
	h := &helper{exited: make(chan error, 1), lines: make(chan string, 16)}
	h.cmd = exec.Command(bin, "-url", node.URL(), "-queue", queue,
		"-concurrency", "4", "-prefetch", strconv.Itoa(frozenPrefetch), "-work", frozenWork.String())
	h.cmd.Stderr = &h.stderr
	stdout, err := h.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, h.cmd.Start())
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), "effect "); ok {
				l.called(id)
				l.effect(id)
				continue
			}
			select {
			case h.lines <- sc.Text():
			default:
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		<-read // Wait closes stdout: read it all first
		h.exited <- h.cmd.Wait()
	}()
	// Whatever happens to the test, the process is resumed and ends with it.
	t.Cleanup(func() {
		_ = h.cmd.Process.Signal(syscall.SIGCONT)
		_ = h.cmd.Process.Kill()
	})
	select {
	case line := <-h.lines:
		require.Equal(t, "running", line, "stderr:\n%s", h.stderr.String())
	case err := <-h.exited:
		t.Fatalf("frozen consumer exited at start: %v\n%s", err, h.stderr.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("frozen consumer not consuming within 90s\n%s", h.stderr.String())
	}
	return h
}

func (h *helper) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, h.cmd.Process.Signal(sig), "signal %v to the frozen consumer", sig)
}

// testFrozenConsumer is scenario 8a: a consumer process is stopped (SIGSTOP) for longer
// than three heartbeats while it holds unacked deliveries, then resumed (SIGCONT). The node
// drops its connections and redelivers what it held to the other consumer; once resumed,
// the process notices, reconnects and consumes again, its late acks go nowhere, and it
// stops cleanly. Nothing confirmed is lost; a side effect may happen twice only for a
// delivery the stopped process held (its idempotency store is its own): at most its
// prefetch.
func testFrozenConsumer(t *testing.T, node *testenv.Node) {
	rabbit := node.Rabbit(t)
	base := takeBaseline(t, node)

	sc := newScenario(t, "faults.frozenc")
	l, queue := sc.l, sc.queue
	st := sc.start(t, amqp.Config{URLs: []string{node.URL()}}, 4, frozenPrefetch, frozenWork)
	// Publishes go through a broker of their own, which outlives the in-test consumer.
	pctx, pcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer pcancel()
	pub, err := amqp.New(pctx, amqp.Config{URLs: []string{node.URL()}, Logger: logger()})
	require.NoError(t, err)
	defer pub.Close()
	withStack, _ := counts(t, node)
	h := startHelper(t, node, l, queue)

	ids := make([]string, 600)
	for i := range ids {
		ids[i] = fmt.Sprintf("fc-%05d", i)
	}
	publishAll(l, pub.Publisher(), queue, ids, 50, 2, 30*time.Second)
	// Freeze the helper in the middle of its work.
	effectsOf := func() int { return l.count(func(r *record) bool { return r.effects > 0 }) }
	require.Eventually(t, func() bool { return effectsOf() >= 100 }, 30*time.Second, 10*time.Millisecond)
	h.signal(t, syscall.SIGSTOP)
	frozen := time.Now()
	t.Logf("consumer stopped after %d side effects; %d messages unacked", effectsOf(), len(ids)-effectsOf())

	// The node drops the stopped process's connections (publish and consume) on missed
	// heartbeats, and the other consumer gets what it held.
	require.Eventually(t, func() bool { return len(missedHeartbeats(node, frozen)) >= 2 }, 30*time.Second, 100*time.Millisecond,
		"the node closes the stopped consumer's two connections on missed heartbeats\n%s", node.LogTail(20))
	dropped := slices.MaxFunc(missedHeartbeats(node, frozen), time.Time.Compare).Sub(frozen)
	require.Eventually(t, func() bool {
		c, _ := counts(t, node)
		return c == withStack
	}, 30*time.Second, 200*time.Millisecond, "the stopped consumer's connections are gone")
	waitSettled(t, l, rabbit, queue, time.Minute)
	require.Eventually(t, func() bool { return rabbit.Count(queue) == 0 }, time.Minute, 50*time.Millisecond, "the queue drained")
	redelivered := lastCall(l).Sub(frozen)
	time.Sleep(time.Until(frozen.Add(consumerFreeze)))
	stopped := time.Since(frozen)

	// Resumed, it notices, reconnects and consumes again: with the other consumer gone,
	// it takes every new message.
	reconnects := strings.Count(h.stderr.String(), "connected to RabbitMQ")
	h.signal(t, syscall.SIGCONT)
	resumed := time.Now()
	require.Eventually(t, func() bool {
		return strings.Count(h.stderr.String(), "connected to RabbitMQ") >= reconnects+2
	}, 30*time.Second, 20*time.Millisecond, "the resumed consumer reconnects both connections\n%s", h.stderr.String())
	reconnected := time.Since(resumed)
	st.close()
	after := make([]string, 100)
	for i := range after {
		after[i] = fmt.Sprintf("fc-after-%05d", i)
	}
	publishAll(l, pub.Publisher(), queue, after, 20, 2, 30*time.Second)
	waitSettled(t, l, rabbit, queue, time.Minute)

	h.signal(t, syscall.SIGTERM)
	select {
	case err := <-h.exited:
		require.NoError(t, err, "the resumed consumer stops cleanly\n%s", h.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the resumed consumer did not stop within 30s of SIGTERM\n%s", h.stderr.String())
	}
	logs := h.stderr.String()
	assert.NotContains(t, logs, "panic")
	assert.NotContains(t, logs, "DATA RACE")
	assert.Contains(t, logs, "RabbitMQ connection lost; reconnecting", "the resumed consumer noticed the loss")
	lateAcks := strings.Count(logs, "ack failed; RabbitMQ will redeliver")

	s := l.check(t, 2)
	assert.LessOrEqual(t, s.Duplicates, frozenPrefetch, "duplicated side effects only for what the stopped consumer held")
	t.Logf("frozen consumer: node dropped it %s after SIGSTOP, the queue drained by the other consumer %s after (last handler call); stopped %s; reconnected %s after SIGCONT; %d late acks reported failed; %+v",
		dropped.Round(time.Millisecond), redelivered.Round(time.Millisecond), stopped.Round(time.Millisecond), reconnected.Round(time.Millisecond), lateAcks, s)
	_ = sc.guard.Close()
	require.NoError(t, pub.Close())
	base.verify(t)
}

// publication is one publish around the broker freeze.
type publication struct {
	start, end time.Time
	err        error
}

// testFrozenBroker is scenario 8b: the node's VM is stopped (SIGSTOP) for 40 s, then
// resumed. sluice's heartbeats detect it; publishes waiting for confirms fail at their
// deadline or are published again, and none is reported confirmed while the node is
// stopped; once it resumes, publishing and consuming resume, nothing confirmed is lost, no
// side effect is doubled, and connections and goroutines return to their baseline.
func testFrozenBroker(t *testing.T, node *testenv.Node) {
	base := takeBaseline(t, node)

	sc := newScenario(t, "faults.frozenb")
	logs, l, queue := sc.logs, sc.l, sc.queue
	st := sc.start(t, amqp.Config{URLs: []string{node.URL()}, Logger: sc.log, ReconnectMaxInterval: time.Second}, 4, 16, 5*time.Millisecond)

	// Two publishers, one message at a time, from before the freeze to after it.
	var mu sync.Mutex
	var pubs []publication
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				id := fmt.Sprintf("fb-%d-%05d", w, i)
				begin := time.Now()
				publishAll(l, st.broker.Publisher(), queue, []string{id}, 1, 1, frozenPublishDeadline)
				var err error
				if o := l.outcome(id); o != confirmed {
					err = fmt.Errorf("%s", o)
				}
				mu.Lock()
				pubs = append(pubs, publication{begin, time.Now(), err})
				mu.Unlock()
			}
		}(w)
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	time.Sleep(3 * time.Second)

	thaw, err := node.Freeze(t)
	require.NoError(t, err)
	frozen := time.Now()
	lost := func() int { return strings.Count(logs.String(), "RabbitMQ connection lost; reconnecting") }
	require.Eventually(t, func() bool { return lost() >= 2 }, brokerFreeze-5*time.Second, 50*time.Millisecond,
		"heartbeats detect the stopped node on both connections\n%s", logs.String())
	detected := time.Since(frozen)
	time.Sleep(time.Until(frozen.Add(brokerFreeze)))
	require.NoError(t, thaw())
	thawed := time.Now()
	t.Logf("node stopped for %s; both connections given up %s after SIGSTOP (heartbeat %s)", thawed.Sub(frozen).Round(time.Millisecond), detected.Round(time.Millisecond), serverHeartbeat)

	// Publishing resumes.
	confirmedSince := func(since time.Time) (time.Time, bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range pubs {
			if p.err == nil && p.end.After(since) {
				return p.end, true
			}
		}
		return time.Time{}, false
	}
	require.Eventually(t, func() bool { _, ok := confirmedSince(thawed); return ok }, time.Minute, 50*time.Millisecond,
		"publishes are confirmed again after the node resumed")
	first, _ := confirmedSince(thawed)
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()

	rabbit := node.Rabbit(t) // now: a client connected before would have died with the freeze
	waitSettled(t, l, rabbit, queue, 2*time.Minute)
	_ = rabbit.Conn.Close()

	// No publish was reported confirmed while the node could not confirm anything (a
	// confirm it sent just before the signal may still be read in the first moment).
	mu.Lock()
	var during, failedN int
	var worstLate time.Duration
	for _, p := range pubs {
		if p.err == nil && p.end.After(frozen.Add(time.Second)) && p.end.Before(thawed) {
			during++
		}
		if p.err != nil {
			failedN++
			worstLate = max(worstLate, p.end.Sub(p.start)-frozenPublishDeadline)
		}
	}
	total := len(pubs)
	mu.Unlock()
	assert.Zero(t, during, "publishes reported confirmed while the node was stopped")

	st.close()
	s := l.check(t, 1)
	t.Logf("frozen broker: %d publishes, %d failed at their deadline (at most %s past it), none confirmed while stopped; first confirm %s after SIGCONT; %+v",
		total, failedN, worstLate.Round(time.Millisecond), first.Sub(thawed).Round(time.Millisecond), s)
	_ = sc.guard.Close()
	// Back to the baseline first with a longer wait than the harness's 30 s: after the
	// freeze each rabbitmqctl call took seconds here (the connections were gone at once,
	// yet a 30 s wait once ran out on the slowness of the calls alone).
	closed := time.Now()
	require.Eventually(t, func() bool { c, ch := counts(t, node); return c == base.conns && ch == base.chans }, 90*time.Second, 500*time.Millisecond,
		"connections and channels back to %d and %d", base.conns, base.chans)
	t.Logf("counts back to the baseline, as rabbitmqctl saw it %s after Close", time.Since(closed).Round(time.Millisecond))
	base.verify(t)
}

// missedHeartbeats returns when node closed a connection for missed client heartbeats,
// since since, from its log: RabbitMQ logs "closing AMQP connection" with a timestamp and
// the reason on the next line.
func missedHeartbeats(node *testenv.Node, since time.Time) []time.Time {
	var at, last time.Time
	var out []time.Time
	for _, line := range strings.Split(node.LogTail(2000), "\n") {
		if len(line) > 32 {
			if ts, err := time.Parse("2006-01-02 15:04:05.000000-07:00", line[:32]); err == nil {
				last = ts
			}
		}
		if strings.Contains(line, "missed heartbeats from client") {
			at = last
			if at.After(since) {
				out = append(out, at)
			}
		}
	}
	return out
}

// lastCall returns the time of l's latest handler call.
func lastCall(l *ledger) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var last time.Time
	for _, r := range l.m {
		for _, c := range r.calls {
			if c.After(last) {
				last = c
			}
		}
	}
	return last
}
