package telemetry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/telemetry"
)

// syncLog is a slog text log a test reads while the watcher writes to it.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *syncLog) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// meters is a meter provider the test reads back.
type meters struct {
	mp     *sdkmetric.MeterProvider
	reader *sdkmetric.ManualReader
}

func newMeters(t *testing.T) *meters {
	t.Helper()
	m := &meters{reader: sdkmetric.NewManualReader()}
	m.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(m.reader))
	t.Cleanup(func() { require.NoError(t, m.mp.Shutdown(context.Background())) })
	return m
}

// collect reads all metrics and returns them by instrument name.
func (m *meters) collect(t *testing.T) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, m.reader.Collect(context.Background(), &rm))
	out := make(map[string]metricdata.Aggregation)
	for _, sm := range rm.ScopeMetrics {
		for _, metric := range sm.Metrics {
			out[metric.Name] = metric.Data
		}
	}
	return out
}

// fakeSource answers depths from a map; a missing name is absent, "broken" fails.
type fakeSource struct {
	mu     sync.Mutex
	depths map[string]sluice.QueueDepth
	reads  int
}

func (s *fakeSource) QueueDepth(_ context.Context, queue string) (sluice.QueueDepth, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	if queue == "broken" {
		return sluice.QueueDepth{}, errors.New("connection refused")
	}
	d, ok := s.depths[queue]
	if !ok {
		return sluice.QueueDepth{}, fmt.Errorf("queue %q: %w", queue, sluice.ErrQueueNotFound)
	}
	return d, nil
}

func (s *fakeSource) set(queue string, d sluice.QueueDepth) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.depths[queue] = d
}

func gaugePoints(t *testing.T, data metricdata.Aggregation) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	if data == nil {
		return out
	}
	g, ok := data.(metricdata.Gauge[int64])
	require.True(t, ok, "want an int64 gauge, got %T", data)
	for _, dp := range g.DataPoints {
		q, _ := dp.Attributes.Value(otelnames.MetricAttrQueue)
		k, _ := dp.Attributes.Value(otelnames.MetricAttrKind)
		key := q.AsString() + "/" + k.AsString()
		if s, ok := dp.Attributes.Value(otelnames.MetricAttrState); ok {
			key += "/" + s.AsString()
		}
		out[key] = dp.Value
	}
	return out
}

// waitRounds waits until rounds says n rounds of reads have completed.
func waitRounds(t *testing.T, rounds func() int64, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return rounds() >= n }, 10*time.Second, 5*time.Millisecond, "%d rounds of depth reads", n)
}

func TestWatchDepth(t *testing.T) {
	e := newMeters(t)
	var log syncLog
	src := &fakeSource{depths: map[string]sluice.QueueDepth{
		"orders":     {Ready: 5, Consumers: 2},
		"orders.dlq": {Ready: 3, Unacked: 1, UnackedKnown: true},
	}}
	queues := append(telemetry.DepthQueuesFor("orders"), telemetry.DepthQueue{Name: "broken", Kind: "consumed"})
	stop, rounds, err := telemetry.WatchDepthRounds(telemetry.DepthConfig{Source: src, Queues: queues, Interval: time.Hour,
		Logger: log.logger(), MeterProvider: e.mp})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, stop()) })
	waitRounds(t, rounds, 1)

	m := e.collect(t)
	assert.Equal(t, map[string]int64{
		"orders/consumed/ready": 5,
		"orders.dlq/dlq/ready":  3, "orders.dlq/dlq/unacked": 1,
	}, gaugePoints(t, m[otelnames.MetricQueueDepth]), "absent and unreadable queues have no series; unacked only where known")
	assert.Equal(t, map[string]int64{"orders/consumed": 2, "orders.dlq/dlq": 0}, gaugePoints(t, m[otelnames.MetricQueueConsumers]))

	// Scrapes read the last values: they do not reach the broker.
	src.mu.Lock()
	reads := src.reads
	src.mu.Unlock()
	for i := 0; i < 5; i++ {
		e.collect(t)
	}
	src.mu.Lock()
	assert.Equal(t, reads, src.reads, "collections read no depth")
	src.mu.Unlock()

	out := log.String()
	assert.Equal(t, 1, strings.Count(out, "queue=orders.dlq.archive"), "one line for the missing archive:\n%s", out)
	assert.Equal(t, 1, strings.Count(out, "queue=sluice.unrouted"), out)
	assert.Contains(t, out, `level=WARN msg="queue depth not reported: reading it failed" queue=broken kind=consumed error="connection refused"`)
}

func TestWatchDepth_PollsAtItsIntervalAndLogsChangesOnce(t *testing.T) {
	e := newMeters(t)
	var log syncLog
	src := &fakeSource{depths: map[string]sluice.QueueDepth{}}
	stop, rounds, err := telemetry.WatchDepthRounds(telemetry.DepthConfig{Source: src, Queues: telemetry.DepthQueuesFor("q")[:1],
		Interval: 500 * time.Millisecond, Logger: log.logger(), MeterProvider: e.mp})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, stop()) })
	waitRounds(t, rounds, 3) // three reads of a missing queue
	assert.Empty(t, gaugePoints(t, e.collect(t)[otelnames.MetricQueueDepth]))
	src.set("q", sluice.QueueDepth{Ready: 7})
	waitRounds(t, rounds, rounds()+2)
	assert.Equal(t, map[string]int64{"q/consumed/ready": 7}, gaugePoints(t, e.collect(t)[otelnames.MetricQueueDepth]))
	out := log.String()
	assert.Equal(t, 1, strings.Count(out, "the queue does not exist"), out)
	assert.Equal(t, 1, strings.Count(out, "readable again"), out)
}

func TestDepthConfig_Validate(t *testing.T) {
	src := &fakeSource{}
	qs := telemetry.DepthQueuesFor("q")
	for name, tc := range map[string]struct {
		cfg  telemetry.DepthConfig
		want error
	}{
		"no source":      {telemetry.DepthConfig{Queues: qs}, telemetry.ErrNoDepthSource},
		"no queues":      {telemetry.DepthConfig{Source: src}, telemetry.ErrNoDepthQueues},
		"interval short": {telemetry.DepthConfig{Source: src, Queues: qs, Interval: 10 * time.Millisecond}, telemetry.ErrDepthInterval},
		"defaults":       {telemetry.DepthConfig{Source: src, Queues: qs}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, telemetry.DefaultDepthInterval, tc.cfg.Interval)
			assert.NotNil(t, tc.cfg.Logger)
		})
	}
}

func TestDepthQueuesFor(t *testing.T) {
	assert.Equal(t, []telemetry.DepthQueue{
		{Name: "a", Kind: "consumed"}, {Name: "a.dlq", Kind: "dlq"}, {Name: "a.dlq.archive", Kind: "archive"},
		{Name: "b", Kind: "consumed"}, {Name: "b.dlq", Kind: "dlq"}, {Name: "b.dlq.archive", Kind: "archive"},
		{Name: "sluice.unrouted", Kind: "unrouted"},
	}, telemetry.DepthQueuesFor("a", "b"))
}

func TestNewManagementSource(t *testing.T) {
	for name, tc := range map[string]struct {
		url string
		ok  bool
	}{
		"http with credentials": {"http://guest:guest@127.0.0.1:15672", true},
		"https with a prefix":   {"https://ops:pw@rabbit.example/rabbitmq/", true},
		"amqp scheme":           {"amqp://user:s3cret@rabbit:5672/", false},
		"no host":               {"http://user:s3cret@/", false},
		"does not parse":        {"http://user:s3cret@rabbit:99999999999/%zz", false},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := telemetry.NewManagementSource(tc.url, "")
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, telemetry.ErrManagementURL)
			assert.NotContains(t, err.Error(), "s3cret", "the password stays out of errors")
		})
	}
}

func TestManagementSource_AnswersOfTheAPI(t *testing.T) {
	var gotPath, gotUser, gotPass string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath = r.URL.EscapedPath()
		gotUser, gotPass, _ = r.BasicAuth()
		switch {
		case strings.HasSuffix(gotPath, "/missing"):
			http.Error(w, `{"error":"Object Not Found","reason":"Not Found"}`, http.StatusNotFound)
		case strings.HasSuffix(gotPath, "/fresh"):
			_, _ = w.Write([]byte(`{}`)) // statistics not collected yet
		case strings.HasSuffix(gotPath, "/denied"):
			http.Error(w, "no", http.StatusUnauthorized)
		default:
			_, _ = w.Write([]byte(`{"messages_ready":3,"messages_unacknowledged":2,"consumers":1}`))
		}
	}))
	t.Cleanup(srv.Close)
	src, err := telemetry.NewManagementSource(strings.Replace(srv.URL, "http://", "http://ops:pw@", 1)+"/prefix", "")
	require.NoError(t, err)
	ctx := context.Background()

	d, err := src.QueueDepth(ctx, "orders.dlq")
	require.NoError(t, err)
	assert.Equal(t, sluice.QueueDepth{Ready: 3, Unacked: 2, UnackedKnown: true, Consumers: 1}, d)
	assert.Equal(t, "/prefix/api/queues/%2F/orders.dlq", gotPath, "the default vhost travels as %2F")
	assert.Equal(t, []string{"ops", "pw"}, []string{gotUser, gotPass})

	_, err = src.QueueDepth(ctx, "missing")
	require.ErrorIs(t, err, sluice.ErrQueueNotFound)
	d, err = src.QueueDepth(ctx, "fresh")
	require.NoError(t, err)
	assert.False(t, d.UnackedKnown, "no unacked figure yet")
	_, err = src.QueueDepth(ctx, "denied")
	require.Error(t, err)
	assert.NotErrorIs(t, err, sluice.ErrQueueNotFound)
	assert.NotContains(t, err.Error(), "pw")
}
