package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/policy"
)

// runSluiceAt runs the CLI with SLUICE_SERVICE_URL set to serviceURL (and PROMETHEUS_URL
// unset) and waits for it.
func runSluiceAt(t *testing.T, bin, serviceURL string, args ...string) cliRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "SLUICE_SERVICE_URL="+serviceURL, "PROMETHEUS_URL=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := cliRun{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		res.code = exit.ExitCode()
	default:
		t.Fatalf("run sluice %v: %v", args, err)
	}
	return res
}

// The payments service serves its retry statistics and its retry decision matrix on its
// metrics address; `sluice retries --json` and `sluice policy --json` read them and count
// what was sent: payments that time out and recover at attempt 2 or 3, payments that time
// out on every attempt, a declined one, and good ones.
func TestRetriesAndPolicyCLIAgainstPayments(t *testing.T) {
	r := testenv.NewRabbit(t)
	queue, output := testenv.Name("e2e.retries.requested"), testenv.Name("e2e.retries.succeeded")
	r.DeleteQueues(queue, topology.DLQ(queue), output, topology.DLQ(output))
	t.Cleanup(func() { r.DeleteQueues(queue, topology.DLQ(queue), output, topology.DLQ(output)) })
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	startPayments(t, append(fastPaymentsEnv(r.URL, queue, output), "METRICS_ADDR="+metricsAddr, "RETRY_LEARNED=on"))
	waitQueue(t, r, queue)
	waitQueue(t, r, output)
	events := collectEvents(t, r, output)
	bin := sluiceCLI(t)
	serviceURL := "http://" + metricsAddr

	run := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)
	sources := []string{
		paymentsim.FlakyToken(1), paymentsim.FlakyToken(1), paymentsim.FlakyToken(1), // recover at attempt 2
		paymentsim.FlakyToken(2), paymentsim.FlakyToken(2), // recover at attempt 3
		paymentsim.TokenTimeout, paymentsim.TokenTimeout, // exhaust 3 retries
		paymentsim.TokenInsufficientFunds, // permanent at once
		"tok_visa", "tok_visa",            // never fail
	}
	for i, src := range sources {
		pid := fmt.Sprintf("pay_%s_%d", run, i)
		r.Publish(queue, amqp091.Publishing{MessageId: pid, ContentType: "application/json", DeliveryMode: amqp091.Persistent, Body: paymentBody(pid, src)})
	}
	require.Eventually(t, func() bool { return len(events()) >= 7 }, 60*time.Second, 50*time.Millisecond, "success events")
	require.Eventually(t, func() bool { return r.Count(topology.DLQ(queue)) >= 3 }, 60*time.Second, 50*time.Millisecond, "dead letters")

	t.Run("retries", func(t *testing.T) {
		var rep struct {
			Source string `json:"source"`
			URL    string `json:"url"`
			retrystats.Report
		}
		byType := map[string]retrystats.TypeReport{}
		// The last outcome is counted once its ack is done, a moment after its event.
		require.Eventually(t, func() bool {
			res := runSluiceAt(t, bin, serviceURL, "retries", "--json", "--handler", "payments")
			require.Equal(t, 0, res.code, "%s", res)
			rep.Types = nil
			require.NoError(t, json.Unmarshal([]byte(res.stdout), &rep), "%s", res)
			byType = map[string]retrystats.TypeReport{}
			for _, ty := range rep.Types {
				byType[ty.ErrorType] = ty
			}
			gt := byType[example_payment.ErrorTypeGatewayTimeout]
			return gt.Recovered == 5 && gt.Exhausted == 2 && gt.InFlight == 0
		}, 30*time.Second, 200*time.Millisecond, "the statistics count every end: %+v", byType)
		assert.Equal(t, "service", rep.Source)
		assert.Equal(t, serviceURL+"/debug/sluice/retries?handler=payments", rep.URL)
		assert.Equal(t, "1h0m0s", rep.Window)
		require.NotNil(t, rep.Learned, "RETRY_LEARNED=on")
		assert.Equal(t, int64(50), rep.Learned.MinEvidence)
		require.Len(t, byType, 2, "only the two error types failed: %+v", byType)

		gt := byType[example_payment.ErrorTypeGatewayTimeout]
		assert.Equal(t, "payments", gt.Handler)
		assert.Equal(t, int64(7), gt.Failed, "7 payments timed out")
		assert.Equal(t, int64(3*1+2*2+2*3), gt.Retries, "1 retry per tok_flaky_1, 2 per tok_flaky_2, 3 per tok_timeout")
		assert.Equal(t, int64(5), gt.Recovered)
		assert.Equal(t, map[string]int64{"2": 3, "3": 2}, gt.RecoveredAt)
		assert.Equal(t, 2, gt.MedianRecoveryAttempt)
		assert.Equal(t, int64(2), gt.Exhausted)
		assert.Equal(t, int64(7), gt.Ended)
		require.NotNil(t, gt.RecoveredPct)
		assert.InDelta(t, 500.0/7, *gt.RecoveredPct, 0.01)
		assert.Zero(t, gt.Permanent+gt.Discarded+gt.DeadLettered+gt.RetryUnlikely)
		require.NotNil(t, gt.Learned)
		assert.Equal(t, retrystats.DecisionNotEnoughEvidence, gt.Learned.Decision, "7 of the 50 messages the policy needs")

		declined := byType[example_payment.ErrorTypeInsufficientFunds]
		assert.Equal(t, int64(1), declined.Failed)
		assert.Equal(t, int64(1), declined.Permanent)
		assert.Zero(t, declined.Retries)
		assert.Zero(t, declined.Recovered)

		// The table says the same, and where it read it.
		res := runSluiceAt(t, bin, serviceURL, "retries")
		require.Equal(t, 0, res.code, "%s", res)
		assert.Contains(t, res.stdout, "Retry statistics from the service at "+serviceURL+"/debug/sluice/retries")
		assert.Regexp(t, `payments\s+gateway_timeout\s+7\s+13\s+5\s+71\.4%\s+2\s+2\s+0\s+0\s+0\s+retry \(not enough evidence\)`, res.stdout)
	})

	t.Run("the metrics sluice retries reads from Prometheus", func(t *testing.T) {
		resp, err := http.Get(serviceURL + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Regexp(t, `sluice_retry_outcomes_total\{[^}]*error_type="gateway_timeout"[^}]*outcome="recovered"[^}]*\} 5`, string(body))
		assert.Regexp(t, `sluice_retry_recovery_attempt_bucket\{[^}]*error_type="gateway_timeout"[^}]*le="2"[^}]*\} 3`, string(body))
	})

	t.Run("policy", func(t *testing.T) {
		res := runSluiceAt(t, bin, serviceURL, "policy", "--json")
		require.Equal(t, 0, res.code, "%s", res)
		var d struct {
			Source string `json:"source"`
			policy.Description
		}
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &d), "%s", res)
		assert.Equal(t, "service", d.Source)
		require.Len(t, d.Handlers, 1)
		h := d.Handlers[0]
		assert.Equal(t, "payments", h.Name)
		assert.Equal(t, queue, h.Queue)
		assert.Equal(t, topology.DLQ(queue), h.DeadLetterQueue)
		assert.Equal(t, topology.Archive(queue), h.Archive)
		assert.Equal(t, 3, h.Retry.MaxRetries, "RETRY_MAX_RETRIES=3")
		assert.Equal(t, 4, h.Retry.MaxAttempts)
		var delays []time.Duration
		for _, s := range h.Retry.Schedule {
			delays = append(delays, time.Duration(s.Delay))
			assert.Equal(t, s.Delay, s.MinDelay, "RETRY_JITTER=0")
		}
		assert.Equal(t, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}, delays)
		require.NotNil(t, h.Breaker)
		assert.Equal(t, "payment-gateway", h.Breaker.Dependency)
		assert.Equal(t, "pause", h.Breaker.WhileOpen)
		assert.Equal(t, policy.Duration(5*time.Second), h.Breaker.OpenTimeout)
		assert.Equal(t, 10, h.Breaker.HalfOpenProbes)
		require.NotNil(t, h.Idempotency)
		assert.Equal(t, topology.IdempotencyJournal(queue), h.Idempotency.Journal)
		assert.Contains(t, h.Idempotency.Key, "key function")
		require.NotNil(t, h.Retry.Learned)
		views := map[string]string{}
		for _, v := range h.Learned {
			views[v.ErrorType] = v.Decision
		}
		assert.Equal(t, retrystats.DecisionNotEnoughEvidence, views[example_payment.ErrorTypeGatewayTimeout])

		res = runSluiceAt(t, bin, serviceURL, "policy", "--markdown")
		require.Equal(t, 0, res.code, "%s", res)
		assert.Contains(t, res.stdout, "## Handler `payments`")
		assert.Contains(t, res.stdout, "| 3 | 4 | 400ms | 400ms – 400ms | 700ms |")
	})
}

// runSluiceWithPrometheus runs the CLI with PROMETHEUS_URL set to promURL.
func runSluiceWithPrometheus(t *testing.T, bin, promURL string, args ...string) cliRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "PROMETHEUS_URL="+promURL, "SLUICE_SERVICE_URL=http://127.0.0.1:1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := cliRun{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		res.code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("run sluice %v: %v", args, err)
	}
	return res
}

// `sluice retries` with PROMETHEUS_URL reads a real Prometheus scraping the payments
// service: its queries are accepted and count the recoveries of the window. A series is
// born with its first failure, and increase() cannot see what a series held at its first
// sample: the second batch is the one counted.
func TestRetriesCLIReadsPrometheus(t *testing.T) {
	r := testenv.NewRabbit(t)
	queue, output := testenv.Name("e2e.promretries.requested"), testenv.Name("e2e.promretries.succeeded")
	r.DeleteQueues(queue, topology.DLQ(queue), output, topology.DLQ(output))
	t.Cleanup(func() { r.DeleteQueues(queue, topology.DLQ(queue), output, topology.DLQ(output)) })
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	startPayments(t, append(fastPaymentsEnv(r.URL, queue, output), "METRICS_ADDR="+metricsAddr))
	waitQueue(t, r, queue)
	waitQueue(t, r, output)
	prom := startPrometheus(t, metricsAddr)
	bin := sluiceCLI(t)
	run := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)
	send := func(batch string, n int) {
		for i := range n {
			pid := fmt.Sprintf("pay_%s_%s_%d", run, batch, i)
			r.Publish(queue, amqp091.Publishing{MessageId: pid, ContentType: "application/json", Body: paymentBody(pid, paymentsim.FlakyToken(1))})
		}
	}
	recovered := `sum(sluice_retry_outcomes_total{handler="payments",error_type="gateway_timeout",outcome="recovered"})`
	send("a", 2)
	prom.eventually(t, recovered, 2, 0)
	time.Sleep(3 * time.Second) // a few samples of the series before the batch counted
	send("b", 3)
	prom.eventually(t, recovered, 5, 0)

	res := runSluiceWithPrometheus(t, bin, prom.url, "retries", "--json", "--window", "10m", "--handler", "payments")
	require.Equal(t, 0, res.code, "%s", res)
	var rep struct {
		Source string `json:"source"`
		URL    string `json:"url"`
		retrystats.Report
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &rep), "%s", res)
	assert.Equal(t, "prometheus", rep.Source)
	assert.Equal(t, prom.url, rep.URL)
	assert.Equal(t, 600.0, rep.WindowSeconds)
	require.Len(t, rep.Types, 1, "%s", res.stdout)
	gt := rep.Types[0]
	assert.Equal(t, "payments", gt.Handler)
	assert.Equal(t, example_payment.ErrorTypeGatewayTimeout, gt.ErrorType)
	// increase() extrapolates a little past the samples it has.
	assert.GreaterOrEqual(t, gt.Recovered, int64(3), "the second batch recovered")
	assert.LessOrEqual(t, gt.Recovered, int64(5))
	assert.Equal(t, gt.Recovered, gt.Ended)
	assert.Equal(t, 2, gt.MedianRecoveryAttempt, "tok_flaky_1 recovers at attempt 2")

	res = runSluiceWithPrometheus(t, bin, prom.url, "retries")
	require.Equal(t, 0, res.code, "%s", res)
	assert.Contains(t, res.stdout, "Retry statistics from Prometheus at "+prom.url+", over the last 1h.")
	assert.Regexp(t, `payments\s+gateway_timeout\s+`, res.stdout)
}
