package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// rssKiB reads a process's resident memory from /proc.
func rssKiB(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			return strconv.Atoi(strings.Fields(line)[1])
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// BenchmarkPaymentsServiceRSS runs the payments service (a plain build, no race detector)
// through 200,000 successful payments on RabbitMQ and reports its resident memory after
// the first 20,000, after 100,000 and after all 200,000, and what the second 100,000 added
// per payment. The idempotency store grows by design until MaxKeys, and so does the
// example gateway's ledger until LedgerLimit (20,000); the store is bounded here at 50,000
// keys so that both are full before 100,000, and whatever the second 100,000 add would be
// a leak. It runs once, whatever b.N is.
func BenchmarkPaymentsServiceRSS(b *testing.B) {
	const total, mid, warm = 200_000, 100_000, 20_000
	r := testenv.NewRabbit(b)
	queue, output := testenv.Name("bench.rss.requested"), testenv.Name("bench.rss.succeeded")
	r.DeleteQueues(queue, topology.DLQ(queue), output, topology.DLQ(output))
	cmd := exec.Command(testenv.PlainBinary(b, "./cmd/payments"), "serve")
	cmd.Env = append(fastPaymentsEnv(r.URL, queue, output), "PAYMENTS_CONCURRENCY=16", "IDEMPOTENCY_MAX_KEYS=50000")
	require.NoError(b, cmd.Start())
	b.Cleanup(func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() })
	require.Eventually(b, func() bool { return r.Count(queue) >= 0 && r.Count(output) >= 0 }, 60*time.Second, 50*time.Millisecond)

	// Drain the output queue as events arrive, so RabbitMQ's memory is not the subject.
	ch, err := r.Conn.Channel()
	require.NoError(b, err)
	require.NoError(b, ch.Qos(500, 0, false))
	events, err := ch.Consume(output, "", true, false, false, false, nil)
	require.NoError(b, err)

	pub, err := r.Conn.Channel()
	require.NoError(b, err)
	require.NoError(b, pub.Confirm(false))
	publish := func(from, to int) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var pending []*amqp091.DeferredConfirmation
		for i := from; i < to; i++ {
			dc, err := pub.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp091.Publishing{
				MessageId: fmt.Sprintf("rss-%d", i), ContentType: "application/json", DeliveryMode: amqp091.Persistent,
				Body: paymentBody(fmt.Sprintf("pay_rss_%d", i), "tok_visa"),
			})
			require.NoError(b, err)
			pending = append(pending, dc)
			if len(pending) == 1000 {
				for _, p := range pending {
					ok, err := p.WaitContext(ctx)
					require.True(b, ok && err == nil)
				}
				pending = pending[:0]
			}
		}
		for _, p := range pending {
			ok, err := p.WaitContext(ctx)
			require.True(b, ok && err == nil)
		}
	}
	received := 0
	await := func(n int) {
		deadline := time.After(5 * time.Minute)
		for received < n {
			select {
			case <-events:
				received++
			case <-deadline:
				b.Fatalf("only %d of %d payments succeeded", received, n)
			}
		}
	}

	b.ResetTimer()
	begin := time.Now()
	publish(0, warm)
	await(warm)
	rssWarm, err := rssKiB(cmd.Process.Pid)
	require.NoError(b, err)
	samples := []string{fmt.Sprintf("%dk:%dMiB", warm/1000, rssWarm/1024)}
	rssMid := 0
	for n := warm; n < total; n += warm {
		publish(n, n+warm)
		await(n + warm)
		kib, err := rssKiB(cmd.Process.Pid)
		require.NoError(b, err)
		samples = append(samples, fmt.Sprintf("%dk:%dMiB", (n+warm)/1000, kib/1024))
		if n+warm == mid {
			rssMid = kib
		}
	}
	b.Logf("resident memory by payments processed: %s", strings.Join(samples, " "))
	elapsed := time.Since(begin)
	rssEnd, err := rssKiB(cmd.Process.Pid)
	require.NoError(b, err)
	b.StopTimer()

	b.ReportMetric(float64(rssWarm)/1024, "MiB-rss@20k")
	b.ReportMetric(float64(rssMid)/1024, "MiB-rss@100k")
	b.ReportMetric(float64(rssEnd)/1024, "MiB-rss@200k")
	b.ReportMetric(float64(rssEnd-rssMid)*1024/float64(total-mid), "bytes-rss/msg@100k-200k")
	b.ReportMetric(float64(total)/elapsed.Seconds(), "msgs/s")
}
