package retrystats_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/retrystats"
)

func TestStats_Report(t *testing.T) {
	s, err := retrystats.New(retrystats.Config{Window: 10 * time.Minute})
	require.NoError(t, err)
	// pay/timeout: 4 messages; two recovered at attempt 2, one at attempt 4, one exhausted.
	for _, attempt := range []int{2, 2, 4} {
		s.Record("pay", retrystats.RetryEvent{ErrorType: "timeout", NewMessage: true, Retried: true, Attempt: 1})
		for a := 2; a < attempt; a++ {
			s.Record("pay", retrystats.RetryEvent{ErrorType: "timeout", Resolved: "timeout", Retried: true, Attempt: a})
		}
		s.Record("pay", retrystats.RetryEvent{ErrorType: "timeout", Resolved: "timeout", End: retrystats.Recovered, Attempt: attempt})
	}
	s.Record("pay", retrystats.RetryEvent{ErrorType: "timeout", NewMessage: true, Retried: true, Attempt: 1})
	s.Record("pay", retrystats.RetryEvent{ErrorType: "timeout", Resolved: "timeout", End: retrystats.Exhausted, Attempt: 2})
	// pay/declined: permanent at once; ship/down: in flight.
	s.Record("pay", retrystats.RetryEvent{ErrorType: "declined", NewMessage: true, End: retrystats.MadePermanent, Attempt: 1})
	s.Record("ship", retrystats.RetryEvent{ErrorType: "down", NewMessage: true, Retried: true, Attempt: 1})

	judged := 0
	judge := func(ts retrystats.TypeStats) retrystats.Verdict {
		judged++
		return retrystats.Verdict{Decision: retrystats.DecisionRetry, Reason: ts.Handler + "/" + ts.ErrorType}
	}
	pct := func(v float64) *float64 { return &v }
	tests := []struct {
		name  string
		judge retrystats.Judge
		want  []retrystats.TypeReport
	}{
		{name: "without a learned policy", want: []retrystats.TypeReport{
			{Handler: "pay", ErrorType: "declined", Failed: 1, Permanent: 1, Ended: 1, RecoveredPct: pct(0)},
			{Handler: "pay", ErrorType: "timeout", Failed: 4, Retries: 6, Recovered: 3, Exhausted: 1, Ended: 4, RecoveredPct: pct(75),
				MedianRecoveryAttempt: 2, RecoveredAt: map[string]int64{"2": 2, "4": 1}},
			{Handler: "ship", ErrorType: "down", Failed: 1, Retries: 1, InFlight: 1},
		}},
		{name: "with a judge", judge: judge, want: []retrystats.TypeReport{
			{Handler: "pay", ErrorType: "declined", Failed: 1, Permanent: 1, Ended: 1, RecoveredPct: pct(0),
				Learned: &retrystats.Verdict{Decision: "retry", Reason: "pay/declined"}},
			{Handler: "pay", ErrorType: "timeout", Failed: 4, Retries: 6, Recovered: 3, Exhausted: 1, Ended: 4, RecoveredPct: pct(75),
				MedianRecoveryAttempt: 2, RecoveredAt: map[string]int64{"2": 2, "4": 1}, Learned: &retrystats.Verdict{Decision: "retry", Reason: "pay/timeout"}},
			{Handler: "ship", ErrorType: "down", Failed: 1, Retries: 1, InFlight: 1, Learned: &retrystats.Verdict{Decision: "retry", Reason: "ship/down"}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := s.Report(tc.judge)
			assert.Equal(t, "10m0s", r.Window)
			assert.Equal(t, 600.0, r.WindowSeconds)
			assert.Equal(t, 10*time.Minute, r.WindowDuration())
			assert.Nil(t, r.Learned)
			assert.Equal(t, tc.want, r.Types)
		})
	}
	assert.Equal(t, 3, judged)
}

func TestReportHandler(t *testing.T) {
	s, err := retrystats.New(retrystats.Config{})
	require.NoError(t, err)
	s.Record("a", retrystats.RetryEvent{ErrorType: "x", NewMessage: true, End: retrystats.MadePermanent, Attempt: 1})
	s.Record("b", retrystats.RetryEvent{ErrorType: "y", NewMessage: true, End: retrystats.MadePermanent, Attempt: 1})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	tests := []struct {
		name     string
		method   string
		query    string
		status   int
		handlers []string
	}{
		{name: "all", method: http.MethodGet, status: http.StatusOK, handlers: []string{"a", "b"}},
		{name: "one handler", method: http.MethodGet, query: "?handler=b", status: http.StatusOK, handlers: []string{"b"}},
		{name: "no such handler", method: http.MethodGet, query: "?handler=c", status: http.StatusOK, handlers: []string{}},
		{name: "not a GET", method: http.MethodPost, status: http.StatusMethodNotAllowed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, srv.URL+tc.query, nil)
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, tc.status, resp.StatusCode)
			if tc.status != http.StatusOK {
				return
			}
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			var r retrystats.Report
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&r))
			got := []string{}
			for _, ty := range r.Types {
				got = append(got, ty.Handler)
			}
			assert.Equal(t, tc.handlers, got)
		})
	}
}
