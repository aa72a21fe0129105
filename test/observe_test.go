package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/otelstep"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
)

// TestDepthSource_PassiveDeclare reads depths over AMQP from the shared broker: ready
// messages and consumers are right, unacked is not claimed, a missing queue is absent.
func TestDepthSource_PassiveDeclare(t *testing.T) {
	r := testenv.NewRabbit(t)
	queue := testenv.Name("obs.depth")
	r.DeleteQueues(queue)
	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	_, err = ch.QueueDeclare(queue, true, false, false, false, nil) // durable: 4.3 denies transient non-exclusive queues
	require.NoError(t, err)
	for i := 0; i < 4; i++ {
		r.Publish(queue, amqp091.Publishing{Body: []byte("x")})
	}
	_, err = ch.Consume(queue, "", false, false, false, false, nil) // a consumer that holds one message
	require.NoError(t, err)
	require.NoError(t, ch.Qos(1, 0, false))

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{r.URL}, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	// The broker is telemetry's depth source as it is, through the router's wrapper too.
	var rb router.Broker = b
	src, ok := rb.(telemetry.DepthSource)
	require.True(t, ok)

	require.Eventually(t, func() bool {
		d, err := src.QueueDepth(ctx, queue)
		return err == nil && d.Consumers == 1 && d.Ready < 4
	}, 10*time.Second, 20*time.Millisecond, "the consumer holds what it was delivered")
	d, err := src.QueueDepth(ctx, queue)
	require.NoError(t, err)
	assert.False(t, d.UnackedKnown, "passive declare does not see unacked messages")

	_, err = src.QueueDepth(ctx, testenv.Name("obs.missing"))
	require.ErrorIs(t, err, sluice.ErrQueueNotFound)
	// The broker's channel for the missing queue was its own: the next read works.
	_, err = src.QueueDepth(ctx, queue)
	require.NoError(t, err)

	state, ok := rb.(otelstep.ConnectionState)
	require.True(t, ok)
	assert.True(t, state.Connected())
	assert.Zero(t, state.Reconnects())
}

// mgmtNode starts a RabbitMQ node of its own with the management plugin, statistics
// every second, and returns it with its management API's URL.
func mgmtNode(t *testing.T) (*testenv.Node, string) {
	t.Helper()
	port := testenv.FreePort(t)
	n := testenv.StartNode(t, testenv.NodeOptions{
		Plugins: []string{"rabbitmq_management"},
		Config: []string{
			"management.tcp.port = " + strconv.Itoa(port),
			"management.tcp.ip = 127.0.0.1",
			"collect_statistics_interval = 500",
		},
	})
	return n, fmt.Sprintf("http://guest:guest@127.0.0.1:%d", port)
}

// TestManagementDepthAndReadiness uses a node of its own: the management API's depths,
// unacked included, and then the payment service's /readyz and connection metrics
// while the node's broker is stopped and started again.
func TestManagementDepthAndReadiness(t *testing.T) {
	n, mgmtURL := mgmtNode(t)
	t.Logf("node with the management plugin started in %s", n.StartTime)
	conn, err := amqp091.Dial(n.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	queue := testenv.Name("obs.mgmt")
	_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	for i := 0; i < 5; i++ {
		require.NoError(t, ch.PublishWithContext(context.Background(), "", queue, false, false, amqp091.Publishing{Body: []byte("x")}))
	}
	require.NoError(t, ch.Qos(2, 0, false))
	_, err = ch.Consume(queue, "", false, false, false, false, nil) // holds 2, unacked
	require.NoError(t, err)

	src, err := telemetry.NewManagementSource(mgmtURL, "")
	require.NoError(t, err)
	ctx := context.Background()
	var last sluice.QueueDepth
	require.Eventually(t, func() bool {
		last, err = src.QueueDepth(ctx, queue)
		return err == nil && last == sluice.QueueDepth{Ready: 3, Unacked: 2, UnackedKnown: true, Consumers: 1}
	}, 30*time.Second, 100*time.Millisecond, "ready 3, unacked 2, 1 consumer; last %+v, %v", last, err)
	_, err = src.QueueDepth(ctx, testenv.Name("obs.missing"))
	require.ErrorIs(t, err, sluice.ErrQueueNotFound)
	wrong, err := telemetry.NewManagementSource("http://guest:s3cret@"+mgmtURL[len("http://guest:guest@"):], "")
	require.NoError(t, err)
	_, err = wrong.QueueDepth(ctx, queue)
	require.Error(t, err, "wrong password")
	assert.NotContains(t, err.Error(), "s3cret")
	_ = ch.Close()

	t.Run("payments readiness follows the node", func(t *testing.T) {
		q, out := testenv.Name("obs.ready.requested"), testenv.Name("obs.ready.succeeded")
		metricsAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		env := append(fastPaymentsEnv(n.URL(), q, out),
			"METRICS_ADDR="+metricsAddr,
			"QUEUE_DEPTH_INTERVAL=500ms",
			"RABBITMQ_MANAGEMENT_URL="+mgmtURL,
		)
		svc := startPayments(t, env)
		get := func(path string) (int, string) {
			resp, err := http.Get("http://" + metricsAddr + path)
			if err != nil {
				return 0, err.Error()
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		metric := func(re string) bool {
			_, body := get("/metrics")
			return regexp.MustCompile(re).MatchString(body)
		}
		require.Eventually(t, func() bool { c, _ := get("/readyz"); return c == http.StatusOK }, 60*time.Second, 50*time.Millisecond)
		// Unacked is reported with the management API, for the queue and its DLQ.
		require.Eventually(t, func() bool {
			return metric(`sluice_queue_depth\{[^}]*queue="` + regexp.QuoteMeta(q) + `",state="unacked"\} 0\n`)
		}, 30*time.Second, 100*time.Millisecond, "unacked depth of the consumed queue")
		assert.True(t, metric(`sluice_connection_up\{[^}]*\} 1\n`))

		// Without the broker the service is alive but not ready; stop_app closes every
		// connection and the listener, and is much quicker than stopping the node.
		out2, err := n.Ctl("stop_app")
		require.NoError(t, err, "%s", out2)
		var body string
		require.Eventually(t, func() bool {
			var c int
			c, body = get("/readyz")
			return c == http.StatusServiceUnavailable
		}, 30*time.Second, 50*time.Millisecond, "not ready without the broker")
		assert.Contains(t, body, "broker: not connected to the broker")
		assert.True(t, metric(`sluice_connection_up\{[^}]*\} 0\n`))
		assert.True(t, metric(`sluice_ready\{[^}]*\} 0\n`))
		c, _ := get("/healthz")
		assert.Equal(t, http.StatusOK, c, "alive while the broker is away")

		// Back: the connection is re-established, counted, and the service ready again.
		out2, err = n.Ctl("start_app")
		require.NoError(t, err, "%s", out2)
		require.Eventually(t, func() bool { c, _ := get("/readyz"); return c == http.StatusOK }, 60*time.Second, 50*time.Millisecond,
			"ready again once reconnected")
		// At least one reconnect is counted: on 4.3 a stream consumer started while the
		// node's stream coordinator is still starting can be refused with INTERNAL_ERROR,
		// which closes the connection once more (a second, accurate, reconnect).
		assert.True(t, metric(`sluice_connection_reconnects_total\{[^}]*\} [1-9][0-9]*\n`), "the reconnect counted")
		assert.True(t, metric(`sluice_connection_up\{[^}]*\} 1\n`))
		if t.Failed() {
			t.Logf("payments logs:\n%s", svc.logs.String())
		}
	})
}
