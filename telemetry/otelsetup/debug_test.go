package otelsetup_test

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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

// The debug endpoints' paths, as docs/operations.md names them.
const (
	retriesPath = otelsetup.DebugPrefix + "retries"
	policyPath  = otelsetup.DebugPrefix + "policy"
)

// debugStack returns a stack with one handler, its retry statistics (nil: none) holding
// one failure of handler "orders".
func debugStack(t *testing.T, stats *retrystats.Stats) *router.Stack {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := memory.New(memory.Config{Logger: logger})
	t.Cleanup(func() { _ = b.Close() })
	s, err := router.New(b, router.Config{Logger: logger, CloseTimeout: 50 * time.Millisecond,
		Retry: retry.Config{MaxRetries: 2, InitialDelay: time.Second, MaxDelay: 2 * time.Second, Jitter: retry.NoJitter, Stats: stats}})
	require.NoError(t, err)
	require.NoError(t, s.Handle("orders", "debug.orders", func(*message.Message) error { return nil }))
	// Run and stopped, so that no goroutine of the router outlives the test.
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-ran
		_ = s.Close()
	})
	<-s.Running()
	if stats != nil {
		stats.Record("orders", retrystats.RetryEvent{ErrorType: "timeout", NewMessage: true, Retried: true, Attempt: 1})
	}
	return s
}

// The debug endpoints serve the stack Operate was last given, on the metrics server and
// on DebugHandler, and say why when there is nothing to serve.
func TestOperate_ServesTheStacksDebugEndpoints(t *testing.T) {
	clearOTelEnv(t)
	restoreGlobals(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	p, err := otelsetup.Setup(context.Background(), otelsetup.Config{MetricsAddr: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { shutdown(t, p) })
	own := httptest.NewServer(p.DebugHandler()) // a server of the caller's own
	t.Cleanup(own.Close)

	get := func(t *testing.T, url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	stats, err := retrystats.New(retrystats.Config{})
	require.NoError(t, err)
	tests := []struct {
		name   string
		stack  *router.Stack // nil: none served yet
		path   string
		status int
		want   string
	}{
		{name: "nothing served yet", path: policyPath, status: 404, want: "Providers.Operate"},
		{name: "no such endpoint", path: otelsetup.DebugPrefix + "nope", status: 404, want: retriesPath},
		{name: "a stack without statistics", stack: debugStack(t, nil), path: retriesPath, status: 404, want: "Retry.Stats"},
		{name: "its policy", path: policyPath, status: 200, want: `"queue": "debug.orders"`},
		{name: "a stack with statistics", stack: debugStack(t, stats), path: retriesPath, status: 200, want: `"error_type": "timeout"`},
		{name: "its policy as Markdown", path: policyPath + "?format=markdown", status: 200, want: "| 2 | 3 | 2s | 2s – 2s | 3s |"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.stack != nil {
				require.NoError(t, p.Operate(tc.stack))
			}
			for _, base := range []string{"http://" + p.MetricsAddr(), own.URL} {
				status, body := get(t, base+tc.path)
				assert.Equal(t, tc.status, status, body)
				assert.Contains(t, body, tc.want)
			}
		})
	}
	// The metrics server still serves what it did.
	status, body := get(t, "http://"+p.MetricsAddr()+"/metrics")
	assert.Equal(t, 200, status)
	assert.Contains(t, body, "sluice_ready")
}

func TestOperate_ServesTheStack(t *testing.T) {
	clearOTelEnv(t)
	restoreGlobals(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	p, err := otelsetup.Setup(context.Background(), otelsetup.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { shutdown(t, p) })
	stats, err := retrystats.New(retrystats.Config{})
	require.NoError(t, err)
	require.NoError(t, p.Operate(debugStack(t, stats)))
	srv := httptest.NewServer(p.DebugHandler())
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + retriesPath + "?handler=orders")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	var r retrystats.Report
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&r))
	require.Len(t, r.Types, 1)
	assert.Equal(t, int64(1), r.Types[0].Failed)
	assert.True(t, strings.HasPrefix(r.Window, "1h"))
}
