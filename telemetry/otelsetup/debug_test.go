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

// *router.Stack is what ServeStack serves.
var _ otelsetup.DebugStack = (*router.Stack)(nil)

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

func TestProviders_ServeStack(t *testing.T) {
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
		{name: "nothing served yet", path: otelsetup.PolicyPath, status: 404, want: "Providers.ServeStack"},
		{name: "no such endpoint", path: otelsetup.DebugPrefix + "nope", status: 404, want: otelsetup.RetriesPath},
		{name: "a stack without statistics", stack: debugStack(t, nil), path: otelsetup.RetriesPath, status: 404, want: "Retry.Stats"},
		{name: "its policy", path: otelsetup.PolicyPath, status: 200, want: `"queue": "debug.orders"`},
		{name: "a stack with statistics", stack: debugStack(t, stats), path: otelsetup.RetriesPath, status: 200, want: `"error_type": "timeout"`},
		{name: "its policy as Markdown", path: otelsetup.PolicyPath + "?format=markdown", status: 200, want: "| 2 | 3 | 2s | 2s – 2s | 3s |"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.stack != nil {
				p.ServeStack(tc.stack)
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
	ops, err := p.Operate(otelsetup.OperateConfig{Stack: debugStack(t, stats)})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, ops.Close()) })
	srv := httptest.NewServer(p.DebugHandler())
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + otelsetup.RetriesPath + "?handler=orders")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	var r retrystats.Report
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&r))
	require.Len(t, r.Types, 1)
	assert.Equal(t, int64(1), r.Types[0].Failed)
	assert.True(t, strings.HasPrefix(r.Window, "1h"))
}
