package console_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }

type nopDelayer struct{}

func (nopDelayer) Delay(context.Context, string, time.Duration, *message.Message) error { return nil }

type keepDeadLetter struct{ msg *message.Message }

func (k *keepDeadLetter) DeadLetter(_ context.Context, _ string, msg *message.Message) error {
	k.msg = msg
	return nil
}

// tracing exports spans to the real Jaeger under a fresh service name, so searches find
// only this test's traces.
type tracing struct {
	jaegerURL string
	service   string
}

func newTracing(t *testing.T) tracing {
	t.Helper()
	jaegerURL := testenv.JaegerQueryURL(t)
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	if endpoint == "" {
		endpoint = "http://127.0.0.1:4318"
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME"} {
		t.Setenv(name, "")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	return tracing{jaegerURL: jaegerURL, service: "sluice-console-test-" + hex.EncodeToString(suffix)}
}

// configure points a console at this Jaeger.
func (tr tracing) configure(c *console.Config) {
	c.JaegerQueryURL = tr.jaegerURL
	c.JaegerUIURL = "http://jaeger.example:16686/"
	c.Service = tr.service
}

// deadLetter plays a message's life through sluice's instrumentation (published, failed,
// waited in the delay, failed again, dead-lettered), flushes its spans to Jaeger, puts its
// failure record into fx's DLQ and returns its trace id.
func (tr tracing) deadLetter(t *testing.T, fx *fixture, id, payload string, failure error) string {
	t.Helper()
	p, err := otelsetup.Setup(context.Background(), otelsetup.Config{ServiceName: tr.service})
	require.NoError(t, err)
	in, err := p.Instrumentation()
	require.NoError(t, err)
	pois := carry.New(carry.Carrier{Host: "worker-1"})
	require.NoError(t, err)

	first := message.NewMessage(id, []byte(payload))
	require.NoError(t, in.WrapPublisher(nopPublisher{}).Publish(fx.queue, first))
	keep := &keepDeadLetter{}
	var retry *message.Message
	handle := in.Middleware(func(m *message.Message) ([]*message.Message, error) {
		if sluice.RetryCount(m.Metadata) == 0 {
			retry = m.Copy()
			retry.Metadata.Set(sluice.HeaderRetryCount, strconv.Itoa(1))
			if err := in.WrapDelayer(nopDelayer{}).Delay(m.Context(), fx.queue, 50*time.Millisecond, retry); err != nil {
				return nil, err
			}
			in.Observe(m.Context(), disposition.Outcome{Disposition: disposition.Disposition{Kind: disposition.Retry, Delay: 50 * time.Millisecond, Reason: failure}})
			return nil, nil
		}
		if err := in.WrapDeadLetterer(keep).DeadLetter(m.Context(), fx.queue, pois.Record(m, fx.queue, sluice.RetryCount(m.Metadata), failure)); err != nil {
			return nil, err
		}
		in.Observe(m.Context(), disposition.Outcome{Disposition: disposition.Disposition{Kind: disposition.DeadLetter, Reason: failure}})
		return nil, nil
	})
	_, err = handle(first)
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond) // the delay the message waits
	_, err = handle(retry.Copy())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.Shutdown(ctx))
	require.NotNil(t, keep.msg)
	fx.publishRecord(t, keep.msg)
	return first.Metadata.Get(headers.TraceParent)[3:35]
}

// TestTimelineFromJaeger exports to the real Jaeger the spans of a message that is
// published, fails, waits in the delay, fails again and is dead-lettered, puts its failure
// record into the DLQ, and expects the message page to draw that life.
func TestTimelineFromJaeger(t *testing.T) {
	tr := newTracing(t)
	fx := newFixture(t, tr.configure)
	traceID := tr.deadLetter(t, fx, "traced-1", `{"order":1}`, errors.New("gateway timeout"))

	var body string
	require.Eventually(t, func() bool {
		_, body = fx.get(t, "/queues/"+fx.queue+"/messages/traced-1")
		return containsAll(body, "attempt 2", "dead letter")
	}, 20*time.Second, 500*time.Millisecond, "the timeline of trace %s", traceID)
	for _, want := range []string{
		"Trace <code>" + traceID + "</code>",
		`href="http://jaeger.example:16686/trace/` + traceID + `"`,
		"attempt 1 · retry in 50ms · gateway timeout",
		"asked 50ms",
		"send " + topology.DLQ(fx.queue),
	} {
		assert.Contains(t, body, want)
	}

	t.Run("Jaeger unreachable", func(t *testing.T) {
		down := newFixture(t, func(c *console.Config) { c.JaegerQueryURL = "http://127.0.0.1:1" })
		down.deadLetter(t, "m-1", `{}`, gatewayDown(), nil)
		code, body := down.get(t, "/queues/"+down.queue+"/messages/m-1")
		assert.Equal(t, 200, code)
		assert.Contains(t, body, "No timeline: Jaeger&#39;s query API at http://127.0.0.1:1 cannot be reached")
	})
	t.Run("no trace", func(t *testing.T) {
		fx.deadLetter(t, "untraced", `{}`, gatewayDown(), nil)
		code, body := fx.get(t, "/queues/"+fx.queue+"/messages/untraced")
		assert.Equal(t, 200, code)
		assert.Contains(t, body, "has no trace of message untraced")
	})
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
