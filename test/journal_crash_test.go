package test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/router"
)

// The child process of TestJournalCrash_BetweenConfirmAndAck reads its part from these.
const (
	envCrashURL    = "SLUICE_JOURNAL_CRASH_URL"
	envCrashQueue  = "SLUICE_JOURNAL_CRASH_QUEUE"
	envCrashLedger = "SLUICE_JOURNAL_CRASH_LEDGER"
	envCrashMode   = "SLUICE_JOURNAL_CRASH_MODE" // hang, journal or off
)

// A payment is charged, its journal record is confirmed by RabbitMQ, and the process is
// killed with SIGKILL before the message's ack: the one instant the issue leaves between
// the two. The restarted process gets the message again (it was never acknowledged),
// restores the key from the journal before consuming, and absorbs the redelivery as a
// duplicate: the ledger shows one charge, the message is acknowledged, nothing is dead
// lettered.
//
// The first process's journal returns from its confirmed append only when the process ends
// (hangAfterConfirm), which holds the message's ack; it prints JOURNAL_CONFIRMED first,
// so the parent kills it exactly there.
func TestJournalCrash_BetweenConfirmAndAck(t *testing.T) {
	for _, tc := range []struct {
		name string
		// forget restarts without the journal (Config.DisableJournal): the control showing
		// the redelivery does reach the handler when nothing restores the key.
		forget  bool
		charged int
	}{
		{"restarted with the journal", false, 1},
		{"restarted without the journal (control)", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testenv.NewRabbit(t)
			queue := testenv.Name("journal.crash")
			r.DeleteQueues(queue, topology.DLQ(queue), topology.IdempotencyJournal(queue))
			ledger := filepath.Join(t.TempDir(), "ledger")
			key := "pay_" + testenv.Name("k")

			first := startCrashChild(t, r.URL, queue, ledger, "hang")
			first.expect(t, "RUNNING")
			msg := message.NewMessage("crash-1", paymentBody(key, "tok_visa"))
			msg.Metadata.Set(sluice.HeaderIdempotencyKey, key)
			(&env{rabbit: r}).publish(t, queue, msg)
			first.expect(t, "JOURNAL_CONFIRMED")
			require.Equal(t, []string{key}, readLedger(t, ledger), "charged once before the kill")
			assert.Zero(t, r.Count(queue), "the message is delivered, not acknowledged yet")
			first.kill()

			// The kill closed the connection: RabbitMQ gives the unacknowledged message back.
			require.Eventually(t, func() bool { return r.Count(queue) == 1 }, 30*time.Second, 20*time.Millisecond,
				"the unacknowledged message is back in its queue")

			mode := "journal"
			if tc.forget {
				mode = "off"
			}
			second := startCrashChild(t, r.URL, queue, ledger, mode)
			second.expect(t, "RUNNING")
			if !tc.forget {
				second.expect(t, "DUPLICATE "+key)
			}
			require.Eventually(t, func() bool { return r.Count(queue) == 0 && len(readLedger(t, ledger)) >= tc.charged },
				30*time.Second, 20*time.Millisecond, "the redelivery acknowledged")
			time.Sleep(time.Second) // a redelivery charged again, or given back, would show by now
			assert.Zero(t, r.Count(queue), "nothing came back to the queue")
			assert.LessOrEqual(t, r.Count(topology.DLQ(queue)), 0, "nothing dead lettered")
			charged := readLedger(t, ledger)
			assert.Len(t, charged, tc.charged, "charges of %s across the kill: %v", key, charged)
			second.stop(t)
		})
	}
}

// TestJournalCrashChild is the process TestJournalCrash_BetweenConfirmAndAck starts and
// kills; run alone it skips.
func TestJournalCrashChild(t *testing.T) {
	url := os.Getenv(envCrashURL)
	if url == "" {
		t.Skip("the child process of TestJournalCrash_BetweenConfirmAndAck")
	}
	queue, ledger := os.Getenv(envCrashQueue), os.Getenv(envCrashLedger)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{url}, Logger: testLogger()})
	require.NoError(t, err)
	defer func() { assert.NoError(t, b.Close()) }()
	mode := os.Getenv(envCrashMode)
	g, err := idempotency.New(idempotency.Config{Logger: testLogger(), DisableJournal: mode == "off", OnDuplicate: func(_ *message.Message, key string) {
		fmt.Println("DUPLICATE " + key)
	}})
	require.NoError(t, err)
	defer func() { assert.NoError(t, g.Close()) }()

	s, err := router.New(&hangingJournals{Broker: b, hang: mode == "hang"},
		router.Config{Logger: testLogger(), Guard: g, CloseTimeout: 5 * time.Second})
	require.NoError(t, err)
	require.NoError(t, s.Handle("charge", queue, func(m *message.Message) error {
		// The side effect, durable before the handler returns: what a payment provider
		// would have recorded.
		f, err := os.OpenFile(ledger, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := f.WriteString(m.Metadata.Get(sluice.HeaderIdempotencyKey) + "\n"); err != nil {
			return err
		}
		return f.Sync()
	}))
	runCtx, stopRun := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	<-s.Running()
	fmt.Println("RUNNING")
	// The parent kills this process, or closes its stdin to end it.
	_, _ = io.Copy(io.Discard, os.Stdin)
	assert.NoError(t, s.Close())
	stopRun()
	<-done
}

// hangingJournals is the broker whose journals, with hang, never return from an append
// RabbitMQ confirmed: the message whose record it was stays unacknowledged.
type hangingJournals struct {
	*amqp.Broker
	hang bool
}

func (h *hangingJournals) Journal(name string, retention time.Duration) broker.Journal {
	j := h.Broker.Journal(name, retention)
	if !h.hang {
		return j
	}
	return &hangAfterConfirm{Journal: j}
}

type hangAfterConfirm struct{ broker.Journal }

func (j *hangAfterConfirm) Append(ctx context.Context, body []byte) error {
	if err := j.Journal.Append(ctx, body); err != nil {
		return err
	}
	fmt.Println("JOURNAL_CONFIRMED")
	<-ctx.Done() // the Guard's Close; the parent kills the process first
	return ctx.Err()
}

// crashChild is a running TestJournalCrashChild process.
type crashChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	once  sync.Once
	ended chan struct{}
}

func startCrashChild(t *testing.T, url, queue, ledger, mode string) *crashChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestJournalCrashChild$", "-test.v")
	cmd.Env = append(os.Environ(), envCrashURL+"="+url, envCrashQueue+"="+queue, envCrashLedger+"="+ledger, envCrashMode+"="+mode)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	c := &crashChild{cmd: cmd, stdin: stdin, lines: make(chan string, 100), ended: make(chan struct{})}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case c.lines <- sc.Text():
			case <-c.ended: // nobody reads any more
				return
			}
		}
	}()
	t.Cleanup(c.kill)
	return c
}

// expect reads the child's output up to a line starting with prefix.
func (c *crashChild) expect(t *testing.T, prefix string) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("the child ended before printing %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return
			}
		case <-timeout:
			t.Fatalf("the child did not print %q within 60s", prefix)
		}
	}
}

// kill ends the child with SIGKILL: no Close, no snapshot, no ack.
func (c *crashChild) kill() {
	c.once.Do(func() {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
		close(c.ended)
	})
}

// stop ends the child cleanly and checks its own test passed.
func (c *crashChild) stop(t *testing.T) {
	t.Helper()
	c.once.Do(func() {
		require.NoError(t, c.stdin.Close())
		errc := make(chan error, 1)
		go func() { errc <- c.cmd.Wait() }()
		select {
		case err := <-errc:
			assert.NoError(t, err, "the child's run failed")
		case <-time.After(30 * time.Second):
			_ = c.cmd.Process.Kill()
			<-errc
			t.Error("the child did not stop within 30s")
		}
		close(c.ended)
	})
}

func readLedger(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	return strings.Fields(string(b))
}
