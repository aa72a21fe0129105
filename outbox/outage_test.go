package outbox_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/outboxstore"

	_ "github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/outbox"
	"github.com/sluice-go/sluice/outbox/pgoutbox"
)

const outage = 10 * time.Second

// TestOutboxOutage runs producers through a RabbitMQ node of the test's own whose app is
// stopped for 10s in the middle of the run (never the shared node).
func TestOutboxOutage(t *testing.T) {
	node := testenv.StartNode(t, testenv.NodeOptions{})
	url := fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", node.Port)
	ctl := func(args ...string) {
		t.Helper()
		out, err := node.Ctl(args...)
		require.NoError(t, err, "rabbitmqctl %v: %s", args, out)
	}

	t.Run("5000 publishes, the broker stopped for 10s in the middle: each has its effect once, in order", func(t *testing.T) {
		const producers, perProducer = 4, 1250
		queue := testenv.Name("outbox.outage")
		b := connect(t, url, queue)
		dir := t.TempDir()
		ob, err := outbox.New(b.Publisher(), outbox.Config{Dir: dir, DirectTimeout: time.Second, Logger: quietLogger()})
		require.NoError(t, err)
		defer ob.Close()

		// A third before the outage (direct), a half during it (the outbox), the rest
		// once the broker is back (behind the outbox until it drains, then direct).
		before, during := perProducer*3/10, perProducer*8/10
		start := time.Now()
		upLat := produce(t, ob, queue, producers, 0, before)
		upRate := float64(producers*before) / time.Since(start).Seconds()

		ctl("stop_app")
		stopped := time.Now()
		start = time.Now()
		downLat := produce(t, ob, queue, producers, before, during)
		downRate := float64(producers*(during-before)) / time.Since(start).Seconds()
		st := ob.Stats()
		// Every publish of the outage is on disk, none forwarded yet (a publish before it
		// that missed DirectTimeout on a loaded machine may be there too).
		require.GreaterOrEqual(t, st.Kept, uint64(producers*(during-before)), "messages kept while the broker was down")
		require.GreaterOrEqual(t, st.Pending, producers*(during-before))
		time.Sleep(time.Until(stopped.Add(outage)))
		ctl("start_app")
		restarted := time.Now()

		produce(t, ob, queue, producers, during, perProducer)
		require.Eventually(t, func() bool { return ob.Stats().Pending == 0 }, 60*time.Second, 50*time.Millisecond, "outbox drained: %+v", ob.Stats())
		drained := time.Since(restarted)
		st = ob.Stats()
		t.Logf("broker up: %d publishes, %.0f msg/s, p50 %s p99 %s; broker down: %d publishes, %.0f msg/s, p50 %s p99 %s (the first waited DirectTimeout); drained %s after start_app; stats %+v",
			producers*before, upRate, percentile(upLat, .5), percentile(upLat, .99),
			producers*(during-before), downRate, percentile(downLat, .5), percentile(downLat, .99), drained, st)
		require.Equal(t, st.Kept, st.Forwarded, "every kept message forwarded")
		require.Equal(t, uint64(producers*perProducer), st.Direct+st.Kept)

		r := consumeOnce(t, b, queue, producers*perProducer)
		requireAllInOrder(t, r, producers, 0, perProducer)
		// Delivery is at-least-once: the publish each producer had in flight at stop_app,
		// and each forwarded entry whose attempt failed without a confirm, may have been
		// stored by the broker and sent again. The consumer's idempotency step, keyed on
		// the message id the outbox keeps, acknowledged those copies without running the
		// handler.
		require.LessOrEqual(t, r.duplicates, producers+int(st.Unconfirmed), "copies delivered twice")
		t.Logf("consumer: %d deliveries, %d copies acknowledged as duplicates, %d side effects", r.total, r.duplicates, producers*perProducer)
		require.NoError(t, ob.Close())
		requireEmptyOutbox(t, dir)
	})

	t.Run("a producer SIGKILLed with a non-empty outbox delivers it after restart", func(t *testing.T) {
		const n = 400
		queue := testenv.Name("outbox.kill")
		b := connect(t, url, queue)
		dir := t.TempDir()

		cmd := exec.Command(os.Args[0], "-test.run=^TestProducerProcess$", "-test.v")
		cmd.Env = append(os.Environ(), "OUTBOX_PRODUCER_URL="+url, "OUTBOX_PRODUCER_DIR="+dir,
			"OUTBOX_PRODUCER_QUEUE="+queue, "OUTBOX_PRODUCER_N="+strconv.Itoa(n))
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		killed := false
		t.Cleanup(func() {
			if !killed {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		})
		lines := bufio.NewScanner(stdout)
		expect := func(prefix string) string {
			t.Helper()
			for lines.Scan() {
				if strings.HasPrefix(lines.Text(), prefix) {
					return strings.TrimPrefix(lines.Text(), prefix)
				}
			}
			t.Fatalf("producer process ended before printing %q: %v", prefix, lines.Err())
			return ""
		}
		expect("READY")
		ctl("stop_app")
		_, err = stdin.Write([]byte("go\n"))
		require.NoError(t, err)
		pending, err := strconv.Atoi(strings.TrimSpace(expect("PENDING ")))
		require.NoError(t, err)
		// Half were published before the stop; the other half are only on disk.
		require.GreaterOrEqual(t, pending, n/2)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
		killed = true
		ctl("start_app")

		ob, err := outbox.New(b.Publisher(), outbox.Config{Dir: dir, Logger: quietLogger()})
		require.NoError(t, err)
		defer ob.Close()
		require.Eventually(t, func() bool { return ob.Stats().Pending == 0 }, 60*time.Second, 50*time.Millisecond, "outbox drained after restart")
		require.Equal(t, uint64(pending), ob.Stats().Forwarded, "what the killed process left")
		r := consumeOnce(t, b, queue, n)
		requireAllInOrder(t, r, 1, 0, n)
		t.Logf("consumer: %d deliveries, %d copies acknowledged as duplicates", r.total, r.duplicates)
		require.NoError(t, ob.Close())
		requireEmptyOutbox(t, dir)
	})

	t.Run("a memory alarm blocks publishers: kept, then forwarded in order when it clears", func(t *testing.T) {
		const producers, perProducer = 2, 200
		queue := testenv.Name("outbox.blocked")
		b := connect(t, url, queue)
		dir := t.TempDir()
		const forwardTimeout = 10 * time.Second // the default
		ob, err := outbox.New(b.Publisher(), outbox.Config{Dir: dir, DirectTimeout: time.Second, ForwardTimeout: forwardTimeout, Logger: quietLogger()})
		require.NoError(t, err)
		defer ob.Close()

		produce(t, ob, queue, producers, 0, perProducer/2)
		ctl("set_vm_memory_high_watermark", "0")
		alarmed := time.Now()
		alarmOn := true
		defer func() {
			if alarmOn { // the test failed before clearing it; the next subtests need it off
				ctl("set_vm_memory_high_watermark", "0.4")
			}
		}()
		produce(t, ob, queue, producers, perProducer/2, perProducer)
		require.GreaterOrEqual(t, ob.Stats().Pending, producers*perProducer/2, "publishes during the alarm kept")
		keptIn := time.Since(alarmed)
		ctl("set_vm_memory_high_watermark", "0.4")
		alarmOn = false
		cleared := time.Now()
		blocked := cleared.Sub(alarmed)
		require.Eventually(t, func() bool { return ob.Stats().Pending == 0 }, 60*time.Second, 50*time.Millisecond, "outbox drained: %+v", ob.Stats())
		t.Logf("memory alarm: %d publishes kept in %s; drained %s after the alarm cleared", producers*perProducer/2, keptIn, time.Since(cleared))
		r := consumeOnce(t, b, queue, producers*perProducer)
		requireAllInOrder(t, r, producers, 0, perProducer)
		// A blocked connection keeps what it was sent and confirms it when the alarm
		// clears: the publish each producer had in flight when the alarm began (its
		// DirectTimeout sent it to the outbox too) and the entries of forward attempts
		// that timed out during the alarm may come twice (at-least-once), nothing more;
		// after a failure the forwarder sends one entry per attempt.
		st := ob.Stats()
		attempts := int(blocked/forwardTimeout) + 1
		require.LessOrEqual(t, st.Unconfirmed, uint64(perProducer/2+attempts), "entries sent by attempts that failed")
		require.LessOrEqual(t, r.duplicates, producers+int(st.Unconfirmed), "copies delivered twice")
		t.Logf("memory alarm of %s: %d messages, %d second copies (bound %d); stats %+v", blocked, producers*perProducer, r.duplicates, producers+int(st.Unconfirmed), st)
		require.NoError(t, ob.Close())
		requireEmptyOutbox(t, dir)
	})

	t.Run("Watermill's SQL forwarder on PostgreSQL, the broker stopped for 10s: each has its effect once, in order", func(t *testing.T) {
		const producers, perProducer = 4, 1250
		db, err := sql.Open("postgres", testenv.PostgresURL(t))
		require.NoError(t, err)
		defer db.Close()
		queue := testenv.Name("outbox.pg")
		b := connect(t, url, queue)
		topic := strings.NewReplacer(".", "_").Replace(testenv.Name("sluice_outbox_test"))
		t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS "watermill_` + topic + `"`) })
		ob, err := pgoutbox.New(db, b.Publisher(), pgoutbox.Config{
			Topic: topic, ForwardTimeout: 2 * time.Second, Logger: quietWatermill(),
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		runDone := make(chan error, 1)
		go func() { runDone <- ob.Run(ctx) }()
		defer func() {
			cancel()
			require.NoError(t, ob.Close())
			<-runDone
		}()
		<-ob.Running()
		pub, err := ob.DBPublisher()
		require.NoError(t, err)

		before, during := perProducer*3/10, perProducer*8/10
		start := time.Now()
		produce(t, pub, queue, producers, 0, before)
		upRate := float64(producers*before) / time.Since(start).Seconds()
		ctl("stop_app")
		stopped := time.Now()
		produce(t, pub, queue, producers, before, during)
		time.Sleep(time.Until(stopped.Add(outage)))
		pendingAtRestart, err := ob.Pending(ctx)
		require.NoError(t, err)
		require.Positive(t, pendingAtRestart, "rows waiting while the broker was down")
		ctl("start_app")
		restarted := time.Now()
		produce(t, pub, queue, producers, during, perProducer)
		require.Eventually(t, func() bool {
			n, err := ob.Pending(ctx)
			return err == nil && n == 0
		}, 120*time.Second, 100*time.Millisecond, "outbox table drained")
		t.Logf("PostgreSQL outbox: inserts %.0f msg/s with the broker up; %d rows waiting at start_app; table empty %s after it",
			upRate, pendingAtRestart, time.Since(restarted))
		r := consumeOnce(t, b, queue, producers*perProducer)
		// Watermill's forwarder is at-least-once: the message it has in flight when the
		// broker stops may be stored by RabbitMQ with its confirm lost, and is sent again
		// (by sluice's publisher on its new connection, then by the forwarder, which deletes
		// the row only after a confirm). No forwarder can tell such a message from one the
		// broker never got, so the copies are recognised where they arrive: by their message
		// id, the Watermill UUID the forwarder carries, in the consumer's idempotency step.
		// Every message's side effect happens exactly once, in order per producer.
		requireAllInOrder(t, r, producers, 0, perProducer)
		t.Logf("consumer: %d deliveries, %d copies acknowledged as duplicates, %d side effects", r.total, r.duplicates, producers*perProducer)
	})
}

// TestProducerProcess is the producer process of the SIGKILL test: it runs only when
// OUTBOX_PRODUCER_URL is set.
func TestProducerProcess(t *testing.T) {
	url := os.Getenv("OUTBOX_PRODUCER_URL")
	if url == "" {
		t.Skip("the SIGKILL test's producer process")
	}
	n, err := strconv.Atoi(os.Getenv("OUTBOX_PRODUCER_N"))
	require.NoError(t, err)
	queue := os.Getenv("OUTBOX_PRODUCER_QUEUE")
	b := connect(t, url, queue)
	ob, err := outbox.New(b.Publisher(), outbox.Config{Dir: os.Getenv("OUTBOX_PRODUCER_DIR"), Logger: quietLogger()})
	require.NoError(t, err)
	produce(t, ob, queue, 1, 0, n/2)
	fmt.Println("READY")
	in := bufio.NewScanner(os.Stdin)
	require.True(t, in.Scan())
	produce(t, ob, queue, 1, n/2, n)
	fmt.Printf("PENDING %d\n", ob.Stats().Pending)
	time.Sleep(time.Hour) // until SIGKILL
}

// requireEmptyOutbox opens the outbox file in dir again and checks that nothing is left.
func requireEmptyOutbox(t testing.TB, dir string) {
	t.Helper()
	_, err := os.Stat(filepath.Join(dir, outboxstore.FileName))
	require.NoError(t, err, "outbox file")
	s, err := outboxstore.OpenStore(dir, 1, 1)
	require.NoError(t, err)
	defer s.Close()
	n, bytes := s.Len()
	require.Zero(t, n, "entries left in the outbox file")
	require.Zero(t, bytes)
}
