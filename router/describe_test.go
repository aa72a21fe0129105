package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/policy"
	"github.com/sluice-go/sluice/router"
)

func describedNoop(*message.Message) error { return nil }

// describedStack is a running stack on the embedded broker with two handlers set up
// differently: "orders" on a plain queue with its breaker named "gateway", pausing, and
// "ledger" on two partitions, deferring while its breaker is open; "orders" compensates
// to exchange describe.sagas with key order.cancel; a learned retry policy
// over statistics that hold a stopped type and a young one.
func describedStack(t *testing.T) (*router.Stack, string, string) {
	t.Helper()
	mem := memory.New(memory.Config{Logger: silentLogger})
	t.Cleanup(func() { _ = mem.Close() })
	stats, err := retrystats.New(retrystats.Config{})
	require.NoError(t, err)
	breakers, err := breaker.New(breaker.Config{OpenTimeout: 7 * time.Second, HalfOpenProbes: 3, Logger: silentLogger})
	require.NoError(t, err)
	guard, err := idempotency.New(idempotency.Config{Logger: silentLogger})
	require.NoError(t, err)
	t.Cleanup(func() { _ = guard.Close() })
	s, err := router.New(mem, router.Config{
		Logger: silentLogger,
		Retry: retry.Config{MaxRetries: 3, InitialDelay: 100 * time.Millisecond, MaxDelay: 300 * time.Millisecond, Jitter: retry.NoJitter,
			Stats: stats, Learned: &retry.Learned{MinEvidence: 10}},
		HandlerTimeout: 5 * time.Second,
		Breakers:       breakers,
		Guard:          guard,
	})
	require.NoError(t, err)
	orders, ledger := uniqueQueue("describe.orders"), uniqueQueue("describe.ledger")
	require.NoError(t, s.Handle("orders", orders, describedNoop, router.WithBreaker("gateway"),
		router.WithCompensation(router.Compensation{Exchange: "describe.sagas", RoutingKey: "order.cancel",
			Build: func(msg, _ *message.Message) (*message.Message, error) {
				return message.NewMessage("", msg.Payload), nil
			}})))
	require.NoError(t, s.Handle("ledger", ledger, describedNoop, router.WithPartitions(2), router.WithDeferWhileOpen()))
	// "down" never recovers: 12 messages exhausted their retries; "flaky" recovered twice.
	for range 12 {
		stats.Record("orders", retrystats.RetryEvent{ErrorType: "down", NewMessage: true, Retried: true})
		stats.Record("orders", retrystats.RetryEvent{ErrorType: "down", Resolved: "down", End: retrystats.Exhausted, Attempt: 4})
	}
	for range 2 {
		stats.Record("ledger", retrystats.RetryEvent{ErrorType: "flaky", NewMessage: true, Retried: true})
		stats.Record("ledger", retrystats.RetryEvent{ErrorType: "flaky", Resolved: "flaky", End: retrystats.Recovered, Attempt: 2})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		_ = s.Close()
		<-done
	})
	select {
	case <-s.Running():
	case <-time.After(10 * time.Second):
		t.Fatal("the stack did not start")
	}
	return s, orders, ledger
}

var describeSeq atomic.Int64

func uniqueQueue(prefix string) string {
	return fmt.Sprintf("%s.%d", prefix, describeSeq.Add(1))
}

func TestDescribe(t *testing.T) {
	s, orders, ledger := describedStack(t)
	d := s.Describe()
	require.Len(t, d.Handlers, 2, "the partitions' handlers are described with their registration")
	byName := map[string]policy.HandlerDescription{}
	for _, h := range d.Handlers {
		byName[h.Name] = h
	}

	tests := []struct {
		name       string
		handler    string
		queue      string
		consumes   []string
		partitions int
		whileOpen  string
		dependency string
		learned    map[string]string // error type -> decision
		compensate string            // where its compensation goes; "" for none
	}{
		{name: "plain queue, pausing breaker", handler: "orders", queue: orders, consumes: []string{orders}, whileOpen: "pause",
			dependency: "gateway", learned: map[string]string{"down": retrystats.DecisionStop},
			compensate: "exchange describe.sagas, key order.cancel"},
		{name: "partitioned, deferring breaker", handler: "ledger", queue: ledger, partitions: 2,
			consumes: []string{topology.Partition(ledger, 0), topology.Partition(ledger, 1)}, whileOpen: "defer",
			dependency: "ledger", learned: map[string]string{"flaky": retrystats.DecisionNotEnoughEvidence}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, ok := byName[tc.handler]
			require.True(t, ok, "handler %s described", tc.handler)
			assert.Equal(t, tc.queue, h.Queue)
			assert.Equal(t, tc.consumes, h.Consumes)
			assert.Equal(t, tc.partitions, h.Partitions)
			assert.Equal(t, topology.DLQ(tc.queue), h.DeadLetterQueue)
			assert.Equal(t, topology.Archive(tc.queue), h.Archive)
			assert.Equal(t, policy.Duration(5*time.Second), h.HandlerTimeout)
			// One turn of its one slot: 5s + 1s grace + two 30s hand-offs + 10s.
			assert.Equal(t, policy.Duration(76*time.Second), h.SettleWithin)

			// The schedule is the step's own backoff: without jitter, exactly Backoff(n).
			assert.Equal(t, 3, h.Retry.MaxRetries)
			assert.Equal(t, 4, h.Retry.MaxAttempts)
			require.Len(t, h.Retry.Schedule, 3)
			var elapsed time.Duration
			for i, r := range h.Retry.Schedule {
				n := i + 1
				want := s.Retry().Backoff(n)
				elapsed += want
				assert.Equal(t, n, r.Retry)
				assert.Equal(t, n+1, r.Attempt)
				assert.Equal(t, want, time.Duration(r.Delay), "retry %d", n)
				assert.Equal(t, r.Delay, r.MinDelay, "no jitter")
				assert.Equal(t, r.Delay, r.MaxDelay, "no jitter")
				assert.Equal(t, elapsed, time.Duration(r.Elapsed))
			}
			assert.Equal(t, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond},
				[]time.Duration{time.Duration(h.Retry.Schedule[0].Delay), time.Duration(h.Retry.Schedule[1].Delay), time.Duration(h.Retry.Schedule[2].Delay)})

			require.NotNil(t, h.Breaker)
			assert.Equal(t, tc.whileOpen, h.Breaker.WhileOpen)
			assert.Equal(t, tc.dependency, h.Breaker.Dependency)
			if tc.dependency != "" {
				assert.Equal(t, policy.Duration(7*time.Second), h.Breaker.OpenTimeout)
				assert.Equal(t, 3, h.Breaker.HalfOpenProbes)
				assert.Equal(t, "closed", h.Breaker.State)
			}
			require.NotNil(t, h.Idempotency)
			assert.Contains(t, h.Idempotency.Key, "idempotency-key")

			classes := map[string]string{}
			for _, c := range h.ErrorClasses {
				classes[c.Class] = c.Action
			}
			assert.Contains(t, classes["retryable"], "up to 3 retries (4 attempts)")
			assert.Contains(t, classes["retryable"], topology.DLQ(tc.queue))
			assert.Contains(t, classes["permanent"], "at once")
			assert.Contains(t, classes, "retry_unlikely")
			assert.Contains(t, classes["breaker_open"], map[string]string{"pause": "pauses", "defer": "deferred"}[tc.whileOpen])
			assert.Equal(t, tc.compensate, h.Compensation)
			if tc.compensate != "" {
				assert.Contains(t, classes["compensation"], "publishes the handler's compensation event to "+tc.compensate)
				assert.Contains(t, classes["compensation"], "not when its last attempt was abandoned")
			} else {
				assert.NotContains(t, classes, "compensation", "a handler without one publishes none")
			}

			require.NotNil(t, h.Retry.Learned)
			assert.Equal(t, int64(10), h.Retry.Learned.MinEvidence)
			got := map[string]string{}
			for _, l := range h.Learned {
				got[l.ErrorType] = l.Decision
			}
			assert.Equal(t, tc.learned, got)
		})
	}
	assert.Contains(t, d.Notes[len(d.Notes)-1], "trip thresholds", "what is not shown is said")
}

func TestDescribe_Jitter(t *testing.T) {
	tests := []struct {
		name    string
		cfg     retry.Config
		retries int
	}{
		{name: "defaults", cfg: retry.Config{}, retries: 5},
		{name: "capped", cfg: retry.Config{MaxRetries: 6, InitialDelay: time.Second, MaxDelay: 5 * time.Second, Jitter: 0.5}, retries: 6},
		{name: "none", cfg: retry.Config{MaxRetries: -1}, retries: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem := memory.New(memory.Config{Logger: silentLogger})
			t.Cleanup(func() { _ = mem.Close() })
			s, err := router.New(mem, router.Config{Logger: silentLogger, Retry: tc.cfg, CloseTimeout: 50 * time.Millisecond})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			require.NoError(t, s.Handle("h", "describe.jitter", describedNoop))
			p := s.Describe().Handlers[0].Retry
			require.Len(t, p.Schedule, tc.retries)
			assert.Equal(t, tc.retries+1, p.MaxAttempts)
			for _, r := range p.Schedule {
				for range 20 {
					d := policy.Duration(s.Retry().Backoff(r.Retry))
					assert.GreaterOrEqual(t, d, r.MinDelay, "retry %d", r.Retry)
					assert.LessOrEqual(t, d, r.MaxDelay, "retry %d", r.Retry)
				}
				assert.LessOrEqual(t, r.Delay, p.MaxDelay)
			}
			assert.Nil(t, s.Describe().Handlers[0].Learned, "no learned policy")
			assert.Nil(t, s.Describe().Handlers[0].Breaker, "no breakers")
		})
	}
}

func TestDescription_Markdown(t *testing.T) {
	s, orders, ledger := describedStack(t)
	md := s.Describe().Markdown()
	tests := []struct {
		name string
		want []string
	}{
		{name: "a section per handler", want: []string{"## Handler `ledger`", "## Handler `orders`"}},
		{name: "queues and dead letters", want: []string{"| Queue | `" + orders + "` |", "| Dead-letter queue | `" + topology.DLQ(orders) + "` |",
			"| Archive | `" + topology.Archive(ledger) + "` |", "| Partitions | 2: `" + topology.Partition(ledger, 0) + "`"}},
		{name: "the schedule", want: []string{"| Retry | Attempt | Delay | With jitter | After first failure |",
			"| 1 | 2 | 100ms | 100ms – 100ms | 100ms |", "| 3 | 4 | 300ms | 300ms – 300ms | 600ms |"}},
		{name: "attempts", want: []string{"| Maximum attempts | 4 (3 retries) |"}},
		{name: "settle bound", want: []string{"| Settle bound | every delivery settled within 1m16s of its delivery, prefetch wait included; RabbitMQ's consumer timeout must not be lower |"}},
		{name: "error classes", want: []string{"| `permanent` | dead-lettered to " + topology.DLQ(orders) + " at once |", "| `breaker_open` |"}},
		{name: "learned view", want: []string{"| `down` | stop retrying (exploring 5%) | dead-lettered at once", "| `flaky` | retry (not enough evidence) |"}},
		{name: "breakers", want: []string{"| `gateway` | closed | 7s | 3 |"}},
		{name: "compensation", want: []string{"| Compensation | on a final dead letter (not a discard, not an abandoned attempt that may still run): an event to exchange describe.sagas, key order.cancel, confirmed with the dead letter before the ack",
			"| Compensation | none |", "| `compensation` | a message dead-lettered (retries exhausted"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, w := range tc.want {
				assert.Contains(t, md, w)
			}
		})
	}
	// Every table row has as many cells as its header.
	var cols int
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "|") {
			cols = 0
			continue
		}
		n := strings.Count(strings.ReplaceAll(line, `\|`, ""), "|")
		if cols == 0 {
			cols = n
		}
		assert.Equal(t, cols, n, "row %q", line)
	}
}

func TestStack_DebugHandlers(t *testing.T) {
	s, orders, _ := describedStack(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/policy":
			s.PolicyHandler().ServeHTTP(w, r)
		case "/retries":
			s.RetriesHandler().ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	get := func(t *testing.T, path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(b)
	}
	tests := []struct {
		name        string
		path        string
		status      int
		contentType string
		check       func(t *testing.T, body string)
	}{
		{name: "policy as JSON", path: "/policy", status: 200, contentType: "application/json", check: func(t *testing.T, body string) {
			var d policy.Description
			require.NoError(t, json.Unmarshal([]byte(body), &d))
			require.Len(t, d.Handlers, 2)
			assert.Equal(t, orders, d.Handlers[1].Queue)
			assert.Equal(t, policy.Duration(100*time.Millisecond), d.Handlers[1].Retry.Schedule[0].Delay)
			assert.Contains(t, body, `"delay": "100ms"`)
		}},
		{name: "policy as Markdown", path: "/policy?format=markdown", status: 200, contentType: "text/markdown", check: func(t *testing.T, body string) {
			assert.True(t, strings.HasPrefix(body, "# Retry decision matrix\n"))
		}},
		{name: "unknown format", path: "/policy?format=yaml", status: 400},
		{name: "retries", path: "/retries", status: 200, contentType: "application/json", check: func(t *testing.T, body string) {
			var r retrystats.Report
			require.NoError(t, json.Unmarshal([]byte(body), &r))
			require.Len(t, r.Types, 2)
			require.NotNil(t, r.Learned)
			assert.Equal(t, int64(10), r.Learned.MinEvidence)
			down := r.Types[1]
			assert.Equal(t, "orders", down.Handler)
			assert.Equal(t, "down", down.ErrorType)
			assert.Equal(t, int64(12), down.Failed)
			assert.Equal(t, int64(12), down.Retries)
			assert.Equal(t, int64(12), down.Exhausted)
			assert.Equal(t, 0.0, *down.RecoveredPct)
			require.NotNil(t, down.Learned)
			assert.Equal(t, retrystats.DecisionStop, down.Learned.Decision)
			assert.True(t, down.Learned.Exploring)
			assert.Equal(t, "0 of 12 recovered in the last hour", down.Learned.Evidence)
			flaky := r.Types[0]
			assert.Equal(t, int64(2), flaky.Recovered)
			assert.Equal(t, 100.0, *flaky.RecoveredPct)
			assert.Equal(t, 2, flaky.MedianRecoveryAttempt)
			assert.Equal(t, retrystats.DecisionNotEnoughEvidence, flaky.Learned.Decision)
		}},
		{name: "retries of one handler", path: "/retries?handler=ledger", status: 200, check: func(t *testing.T, body string) {
			var r retrystats.Report
			require.NoError(t, json.Unmarshal([]byte(body), &r))
			require.Len(t, r.Types, 1)
			assert.Equal(t, "flaky", r.Types[0].ErrorType)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := get(t, tc.path)
			require.Equal(t, tc.status, resp.StatusCode, body)
			if tc.contentType != "" {
				assert.Contains(t, resp.Header.Get("Content-Type"), tc.contentType)
			}
			if tc.check != nil {
				tc.check(t, body)
			}
		})
	}
}

func TestStack_RetriesHandlerWithoutStats(t *testing.T) {
	mem := memory.New(memory.Config{Logger: silentLogger})
	t.Cleanup(func() { _ = mem.Close() })
	s, err := router.New(mem, router.Config{Logger: silentLogger, CloseTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	assert.Nil(t, s.RetriesHandler(), "no statistics, no endpoint")
	ok := s.HasRetryReport()
	assert.False(t, ok)
}

func TestDuration_JSON(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{d: 24 * time.Hour, want: `"24h"`},
		{d: 90 * time.Minute, want: `"1h30m"`},
		{d: 10 * time.Minute, want: `"10m"`},
		{d: 1500 * time.Millisecond, want: `"1.5s"`},
		{d: 100 * time.Millisecond, want: `"100ms"`},
		{d: 0, want: `"0s"`},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			b, err := json.Marshal(policy.Duration(tc.d))
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(b))
			var back policy.Duration
			require.NoError(t, json.Unmarshal(b, &back))
			assert.Equal(t, policy.Duration(tc.d), back)
		})
	}
	var n policy.Duration
	require.NoError(t, json.Unmarshal([]byte("2000000000"), &n), "nanoseconds are read too")
	assert.Equal(t, policy.Duration(2*time.Second), n)
	assert.Error(t, json.Unmarshal([]byte(`"soon"`), &n))
}

// The learned policy's Shorten shows in the matrix: the setting, and for a retried type
// with enough recoveries the attempt its schedule is cut to.
func TestDescription_LearnedShorten(t *testing.T) {
	mem := memory.New(memory.Config{Logger: silentLogger})
	t.Cleanup(func() { _ = mem.Close() })
	stats, err := retrystats.New(retrystats.Config{})
	require.NoError(t, err)
	s, err := router.New(mem, router.Config{
		Logger: silentLogger,
		Retry:  retry.Config{MaxRetries: 3, Jitter: retry.NoJitter, Stats: stats, Learned: &retry.Learned{MinEvidence: 10, Shorten: true}},
	})
	require.NoError(t, err)
	q := uniqueQueue("describe.shorten")
	require.NoError(t, s.Handle("orders", q, describedNoop))
	for range retry.MinShortenRecoveries {
		stats.Record("orders", retrystats.RetryEvent{ErrorType: "flaky", NewMessage: true, Retried: true})
		stats.Record("orders", retrystats.RetryEvent{ErrorType: "flaky", Resolved: "flaky", End: retrystats.Recovered, Attempt: 2})
	}
	d := s.Describe()
	require.Len(t, d.Handlers, 1)
	require.Len(t, d.Handlers[0].Learned, 1)
	assert.Equal(t, 2, d.Handlers[0].Learned[0].ShortenTo)
	assert.True(t, d.Handlers[0].Retry.Learned.Shorten)
	md := d.Markdown()
	assert.Contains(t, md, "shortens a schedule to the attempt by which 99% of recoveries came")
	assert.Contains(t, md, "| `flaky` | retry | retried: 100 of 100 recovered in the last hour; schedule shortened to attempt 2, by which 99% of 100 recoveries came |")
}
