package otelstep_test

import (
	"bytes"
	"fmt"
	"log/slog"
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
	"github.com/sluice-go/sluice/internal/otelstep"
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
	e := newEnv(t, otelstep.Config{ErrorTypeLimit: 2})
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
	assert.Equal(t, int64(2), sumPoint(t, m[otelnames.MetricRetries], q, typ(otelstep.ErrorTypeOther)))
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
	e := newEnv(t, otelstep.Config{EventLog: log.logger(), EventLogLines: 3, EventLogInterval: time.Hour})
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
	e := newEnv(t, otelstep.Config{EventLog: log.logger(), EventLogLines: 1, EventLogInterval: 2 * time.Second})
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
