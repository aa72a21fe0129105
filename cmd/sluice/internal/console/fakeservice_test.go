package console_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/cmd/sluice/internal/retryview"
	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/internal/stackview"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// newFakeService serves a real stack's debug endpoints (/debug/sluice/retries and
// /debug/sluice/policy) as a payment service's metrics server does, with statistics a
// payment service could have after a bad hour:
//
//   - payments compensates to exchange orders, key payment.failed;
//   - payments, gateway_timeout: 38 failed, 25 recovered (median attempt 2), 10
//     exhausted, 3 retries in flight: 71.4% recovered;
//   - payments, insufficient_funds: 12 made permanent at the first attempt;
//   - payments, ledger_unavailable: 40 exhausted, none recovered, so the learned policy
//     stopped retrying it ("0 of 40 recovered in the last hour"), and 9 more were then
//     dead-lettered at once (retry_unlikely);
//   - payments, rate_limited: 8 failed, all recovered at attempt 2;
//   - refunds, psp_timeout: 6 failed, 5 recovered, 1 exhausted.
func newFakeService(t *testing.T) string {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := memory.New(memory.Config{Logger: logger})
	t.Cleanup(func() { _ = b.Close() })
	stats, err := retrystats.New(retrystats.Config{})
	require.NoError(t, err)
	overload, err := retry.NewOverload(retry.OverloadConfig{BudgetRatio: 0.2})
	require.NoError(t, err)
	breakers, err := breaker.New(breaker.Config{ConsecutiveFailures: 5, Logger: logger})
	require.NoError(t, err)
	s, err := router.New(b, router.Config{Logger: logger, CloseTimeout: 50 * time.Millisecond, Breakers: breakers,
		Retry: retry.Config{MaxRetries: 5, InitialDelay: 500 * time.Millisecond, Multiplier: 2, MaxDelay: 10 * time.Second, Jitter: 0.2,
			Stats: stats, Learned: &retry.Learned{MinEvidence: 20}, Overload: overload}})
	require.NoError(t, err)
	nop := func(*message.Message) error { return nil }
	require.NoError(t, s.Handle("payments", "payments.requested", nop, router.WithBreaker("card-gateway"),
		router.WithCompensation(router.Compensation{Exchange: "orders", RoutingKey: "payment.failed",
			Build: func(msg, _ *message.Message) (*message.Message, error) {
				return message.NewMessage("", msg.Payload), nil
			}})))
	require.NoError(t, s.Handle("refunds", "refunds.requested", nop))
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-ran
		_ = s.Close()
	})
	<-s.Running()

	// fail records a message that failed with typ at attempt 1 and, retried each time,
	// ended at attempt at with end (EndNone: still retrying).
	fail := func(handler, typ string, at int, end retrystats.RetryEnd) {
		stats.Record(handler, retrystats.RetryEvent{ErrorType: typ, NewMessage: true, Retried: true, Attempt: 1})
		for a := 2; a < at; a++ {
			stats.Record(handler, retrystats.RetryEvent{ErrorType: typ, Resolved: typ, Retried: true, Attempt: a})
		}
		if end != retrystats.EndNone {
			stats.Record(handler, retrystats.RetryEvent{ErrorType: typ, Resolved: typ, End: end, Attempt: at})
		}
	}
	for i := range 25 {
		at := 2
		switch {
		case i >= 22:
			at = 4
		case i >= 15:
			at = 3
		}
		fail("payments", "gateway_timeout", at, retrystats.Recovered)
	}
	for range 10 {
		fail("payments", "gateway_timeout", 6, retrystats.Exhausted)
	}
	for range 3 {
		fail("payments", "gateway_timeout", 2, retrystats.EndNone)
	}
	for range 12 {
		stats.Record("payments", retrystats.RetryEvent{ErrorType: "insufficient_funds", NewMessage: true, End: retrystats.MadePermanent, Attempt: 1})
	}
	for range 40 {
		fail("payments", "ledger_unavailable", 6, retrystats.Exhausted)
	}
	for range 9 {
		stats.Record("payments", retrystats.RetryEvent{ErrorType: "ledger_unavailable", NewMessage: true, End: retrystats.Unlikely, Attempt: 1})
	}
	for range 8 {
		fail("payments", "rate_limited", 2, retrystats.Recovered)
	}
	for range 5 {
		fail("refunds", "psp_timeout", 3, retrystats.Recovered)
	}
	fail("refunds", "psp_timeout", 6, retrystats.Exhausted)

	view, _ := stackview.Of(s)
	mux := http.NewServeMux()
	mux.Handle(retryview.RetriesPath, view.Retries)
	mux.Handle(retryview.PolicyPath, view.Policy)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// newFakePrometheus answers /api/v1/query as Prometheus does, with the retry outcomes of
// handler payments, and counts the queries.
func newFakePrometheus(t *testing.T) *httptest.Server {
	t.Helper()
	type sample struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	}
	s := func(v string, labels ...string) sample {
		m := map[string]string{}
		for i := 0; i+1 < len(labels); i += 2 {
			m[labels[i]] = labels[i+1]
		}
		return sample{Metric: m, Value: [2]any{1.7e9, v}}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/query" {
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query().Get("query")
		var result []sample
		switch {
		case strings.Contains(q, retryview.PromOutcomes):
			// increase() extrapolates: counts come back as floats.
			result = []sample{
				s("70.0002", "handler", "payments", "error_type", "gateway_timeout", "outcome", "failed"),
				s("121", "handler", "payments", "error_type", "gateway_timeout", "outcome", "retried"),
				s("49.9999", "handler", "payments", "error_type", "gateway_timeout", "outcome", "recovered"),
				s("20", "handler", "payments", "error_type", "gateway_timeout", "outcome", "exhausted"),
				s("40", "handler", "payments", "error_type", "ledger_unavailable", "outcome", "failed"),
				s("200", "handler", "payments", "error_type", "ledger_unavailable", "outcome", "retried"),
				s("40", "handler", "payments", "error_type", "ledger_unavailable", "outcome", "exhausted"),
			}
		case strings.Contains(q, retryview.PromRecovery):
			for le, n := range map[string]string{"2": "30", "3": "44", "4": "50", "+Inf": "50"} {
				result = append(result, s(n, "handler", "payments", "error_type", "gateway_timeout", "le", le))
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{"resultType": "vector", "result": result}})
	}))
	t.Cleanup(srv.Close)
	return srv
}
