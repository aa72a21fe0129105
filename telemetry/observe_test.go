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

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/telemetry"
)

// namedErr is an error whose error.type is its name.
type namedErr string

func (e namedErr) Error() string     { return string(e) + " failed" }
func (e namedErr) ErrorType() string { return string(e) }

// syncLog is a slog text log a test reads while handlers write to it.
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

func TestMetrics_ErrorTypeCap(t *testing.T) {
	e := newEnv(t, telemetry.WithErrorTypeLimit(2))
	queue := uniqueQueue("cap")
	ps, results := e.runRouter(t, queue, func(msg *message.Message) ([]*message.Message, error) {
		err := namedErr(msg.Payload)
		reportTo(e.in, msg.Context(), testReport{Outcome: disposition.Retry, Delay: 250 * time.Millisecond, Err: err})
		return nil, nil
	}, routerOpts{})
	// Four distinct types, the first twice: the first two keep their names.
	kinds := []string{"alpha", "beta", "alpha", "gamma", "delta"}
	for _, k := range kinds {
		require.NoError(t, ps.Publish(queue, message.NewMessage(k, []byte(k))))
		next(t, results)
	}
	m := e.collect(t)
	q := otelnames.MetricAttrQueue.String(queue)
	typ := func(v string) attribute.KeyValue { return otelnames.MetricAttrErrorType.String(v) }
	assert.Equal(t, int64(2), sumPoint(t, m[otelnames.MetricRetries], q, typ("alpha")))
	assert.Equal(t, int64(1), sumPoint(t, m[otelnames.MetricRetries], q, typ("beta")))
	assert.Equal(t, int64(2), sumPoint(t, m[otelnames.MetricRetries], q, typ(telemetry.ErrorTypeOther)))
	assert.Len(t, m[otelnames.MetricRetries].(metricdata.Sum[int64]).DataPoints, 3, "two named types and _OTHER")

	delay, ok := m[otelnames.MetricRetryDelay].(metricdata.Histogram[float64])
	require.True(t, ok, "retry delay is a float64 histogram, got %T", m[otelnames.MetricRetryDelay])
	require.Len(t, delay.DataPoints, 1)
	assert.Equal(t, uint64(len(kinds)), delay.DataPoints[0].Count)
	assert.InDelta(t, 0.25*float64(len(kinds)), delay.DataPoints[0].Sum, 1e-9, "delays in seconds")
}

func TestMetrics_MessagingConventions(t *testing.T) {
	e := newEnv(t)
	queue := uniqueQueue("conv")
	ps, results := e.runRouter(t, queue, func(msg *message.Message) ([]*message.Message, error) {
		if string(msg.Payload) == "fail" {
			reportTo(e.in, msg.Context(), testReport{Outcome: disposition.DeadLetter, Err: sluice.Permanent(namedErr("invalid"))})
		}
		return nil, nil
	}, routerOpts{})
	for _, p := range []string{"ok", "fail", "ok"} {
		require.NoError(t, ps.Publish(queue, message.NewMessage(p, []byte(p))))
		next(t, results)
	}
	pub := e.in.WrapPublisher(&fakePublisher{})
	require.NoError(t, pub.Publish("out", message.NewMessage("1", nil), message.NewMessage("2", nil)))
	failing := e.in.WrapPublisher(&fakePublisher{err: namedErr("nack")})
	require.Error(t, failing.Publish("out", message.NewMessage("3", nil)))

	m := e.collect(t)
	dest := semconv.MessagingDestinationName(queue)
	rabbit := semconv.MessagingSystemKey.String("rabbitmq")
	assert.Equal(t, int64(3), sumPoint(t, m[otelnames.MetricConsumedMessages], dest, rabbit, semconv.MessagingOperationName("process")))

	proc, ok := m[otelnames.MetricProcessDuration].(metricdata.Histogram[float64])
	require.True(t, ok, "got %T", m[otelnames.MetricProcessDuration])
	counts := map[string]uint64{}
	for _, dp := range proc.DataPoints {
		et, _ := dp.Attributes.Value(semconv.ErrorTypeKey)
		counts[et.AsString()] += dp.Count
	}
	assert.Equal(t, map[string]uint64{"": 2, "invalid": 1}, counts, "attempts by error.type")

	out := semconv.MessagingDestinationName("out")
	send := semconv.MessagingOperationName("send")
	assert.Equal(t, int64(3), sumPoint(t, m[otelnames.MetricSentMessages], out, send, rabbit))
	assert.Equal(t, int64(1), sumPoint(t, m[otelnames.MetricSentMessages], out, semconv.ErrorTypeKey.String("nack")))
	opd, ok := m[otelnames.MetricOperationDuration].(metricdata.Histogram[float64])
	require.True(t, ok, "got %T", m[otelnames.MetricOperationDuration])
	var n uint64
	for _, dp := range opd.DataPoints {
		n += dp.Count
	}
	assert.Equal(t, uint64(2), n, "one operation per publish call")
}

func TestEventLog_RateLimited(t *testing.T) {
	var log syncLog
	e := newEnv(t, telemetry.WithEventLog(log.logger(), telemetry.LogLimit{Lines: 3, Interval: time.Hour}))
	queue := uniqueQueue("log")
	ps, results := e.runRouter(t, queue, func(msg *message.Message) ([]*message.Message, error) {
		if string(msg.Payload) == "dead" {
			reportTo(e.in, msg.Context(), testReport{Outcome: disposition.DeadLetter, Attempt: 4, Err: namedErr("invalid")})
		} else {
			reportTo(e.in, msg.Context(), testReport{Outcome: disposition.Retry, Attempt: 2, Delay: 1500 * time.Millisecond, Err: namedErr("timeout")})
		}
		return nil, nil
	}, routerOpts{})
	payloads := []string{"retry", "dead", "retry", "retry", "dead", "retry", "retry"}
	for i, p := range payloads {
		require.NoError(t, ps.Publish(queue, message.NewMessage(fmt.Sprintf("m%d", i), []byte(p))))
		next(t, results)
	}
	out := log.String()
	assert.Equal(t, 3, strings.Count(out, "level=INFO"), "the first 3 lines in the window, no more:\n%s", out)
	assert.Contains(t, out, `level=INFO msg="message handed to the broker for a retry" queue=`+queue+` message_id=m0 attempt=2 error_type=timeout handler=test-handler delay=1.5s`)
	assert.Contains(t, out, `level=INFO msg="message dead-lettered" queue=`+queue+` message_id=m1 attempt=4 error_type=invalid handler=test-handler dlq=`+queue+`.dlq`)

	m := e.collect(t)
	assert.Equal(t, int64(3), sumPoint(t, m[otelnames.MetricLogDropped], attribute.String(otelnames.MetricAttrEvent, "retry")))
	assert.Equal(t, int64(1), sumPoint(t, m[otelnames.MetricLogDropped], attribute.String(otelnames.MetricAttrEvent, "dead_letter")))
}

func TestEventLog_NewWindowSumsUpDrops(t *testing.T) {
	var log syncLog
	e := newEnv(t, telemetry.WithEventLog(log.logger(), telemetry.LogLimit{Lines: 1, Interval: 2 * time.Second}))
	queue := uniqueQueue("window")
	ps, results := e.runRouter(t, queue, func(msg *message.Message) ([]*message.Message, error) {
		reportTo(e.in, msg.Context(), testReport{Outcome: disposition.Retry, Delay: time.Second, Err: namedErr("timeout")})
		return nil, nil
	}, routerOpts{})
	for i := 0; i < 3; i++ {
		require.NoError(t, ps.Publish(queue, message.NewMessage(fmt.Sprintf("a%d", i), nil)))
		next(t, results)
	}
	time.Sleep(2100 * time.Millisecond) // the window closes
	require.NoError(t, ps.Publish(queue, message.NewMessage("b", nil)))
	next(t, results)
	out := log.String()
	assert.Equal(t, 2, strings.Count(out, "level=INFO"), out)
	assert.Contains(t, out, `level=WARN msg="retry and dead-letter log lines dropped by the rate limit" dropped=2 limit_lines=1 limit_interval=2s`)
	assert.Contains(t, out, "message_id=b ")
}

// fakeSource answers depths from a map; a missing name is absent, "broken" fails.
type fakeSource struct {
	mu     sync.Mutex
	depths map[string]telemetry.QueueDepth
	reads  int
}

func (s *fakeSource) QueueDepth(_ context.Context, queue string) (telemetry.QueueDepth, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	if queue == "broken" {
		return telemetry.QueueDepth{}, errors.New("connection refused")
	}
	d, ok := s.depths[queue]
	if !ok {
		return telemetry.QueueDepth{}, fmt.Errorf("queue %q: %w", queue, sluice.ErrQueueNotFound)
	}
	return d, nil
}

func (s *fakeSource) set(queue string, d telemetry.QueueDepth) {
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

// waitRounds waits until w has completed n rounds of reads.
func waitRounds(t *testing.T, w *telemetry.DepthWatcher, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return w.Rounds() >= n }, 10*time.Second, 5*time.Millisecond, "%d rounds of depth reads", n)
}

func TestWatchDepth(t *testing.T) {
	e := newEnv(t)
	var log syncLog
	src := &fakeSource{depths: map[string]telemetry.QueueDepth{
		"orders":     {Ready: 5, Consumers: 2},
		"orders.dlq": {Ready: 3, Unacked: 1, UnackedKnown: true},
	}}
	queues := append(telemetry.DepthQueuesFor("orders"), telemetry.DepthQueue{Name: "broken", Kind: "consumed"})
	w, err := e.in.WatchDepth(telemetry.DepthConfig{Source: src, Queues: queues, Interval: time.Hour, Logger: log.logger()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, w.Close()) })
	waitRounds(t, w, 1)

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
	e := newEnv(t)
	var log syncLog
	src := &fakeSource{depths: map[string]telemetry.QueueDepth{}}
	w, err := e.in.WatchDepth(telemetry.DepthConfig{Source: src, Queues: telemetry.DepthQueuesFor("q")[:1],
		Interval: 500 * time.Millisecond, Logger: log.logger()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, w.Close()) })
	waitRounds(t, w, 3) // three reads of a missing queue
	assert.Empty(t, gaugePoints(t, e.collect(t)[otelnames.MetricQueueDepth]))
	src.set("q", telemetry.QueueDepth{Ready: 7})
	waitRounds(t, w, w.Rounds()+2)
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

func TestHealth(t *testing.T) {
	var h telemetry.Health
	connected := true
	h.AddReadyCheck("broker", func() error {
		if !connected {
			return errors.New("not connected to RabbitMQ")
		}
		return nil
	})
	get := func(handler http.Handler) (int, string) {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		return rec.Code, rec.Body.String()
	}
	for _, tc := range []struct {
		name      string
		connected bool
		pause     string
		code      int
		body      string
	}{
		{"ready", true, "", http.StatusOK, "ready\n"},
		{"disconnected", false, "", http.StatusServiceUnavailable, "not ready\nbroker: not connected to RabbitMQ\n"},
		{"paused", true, "queue over its limit", http.StatusServiceUnavailable, "not ready\npaused by overload: queue over its limit\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			connected = tc.connected
			if tc.pause != "" {
				h.Pause("overload", tc.pause)
				defer h.Resume("overload")
			}
			code, body := get(h.ReadinessHandler())
			assert.Equal(t, tc.code, code)
			assert.Equal(t, tc.body, body)
			code, body = get(h.LivenessHandler())
			assert.Equal(t, http.StatusOK, code, "liveness does not depend on readiness")
			assert.Equal(t, "ok\n", body)
		})
	}
}

// fakeConn is a connection whose state the test sets.
type fakeConn struct {
	mu         sync.Mutex
	up         bool
	reconnects int64
}

func (c *fakeConn) Connected() bool   { c.mu.Lock(); defer c.mu.Unlock(); return c.up }
func (c *fakeConn) Reconnects() int64 { c.mu.Lock(); defer c.mu.Unlock(); return c.reconnects }

func TestRegisterConnection(t *testing.T) {
	e := newEnv(t)
	c := &fakeConn{up: true}
	reg, err := e.in.RegisterConnection(c)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Unregister()) })
	m := e.collect(t)
	assert.Equal(t, int64(1), m[otelnames.MetricConnectionUp].(metricdata.Gauge[int64]).DataPoints[0].Value)
	assert.Equal(t, int64(0), sumPoint(t, m[otelnames.MetricReconnects]))
	c.mu.Lock()
	c.up, c.reconnects = false, 2
	c.mu.Unlock()
	m = e.collect(t)
	assert.Equal(t, int64(0), m[otelnames.MetricConnectionUp].(metricdata.Gauge[int64]).DataPoints[0].Value)
	assert.Equal(t, int64(2), sumPoint(t, m[otelnames.MetricReconnects], semconv.MessagingSystemKey.String("rabbitmq")))
	_, err = e.in.RegisterConnection(nil)
	require.Error(t, err)
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
	assert.Equal(t, telemetry.QueueDepth{Ready: 3, Unacked: 2, UnackedKnown: true, Consumers: 1}, d)
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
