package console_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// hostile is text a producer could put in a payload, a header or an error message.
const hostile = `<script>document.title="pwned"</script><img src=x onerror=alert(1)>`

// fixture is a queue with sluice's topology (declared by sluice's own broker), its DLQ
// and a console serving it.
type fixture struct {
	rabbit *testenv.Rabbit
	queue  string
	// audit is the console's audit exchange (and queue): the test's own, removed when it
	// ends.
	audit   string
	srv     *httptest.Server
	console *console.Server
}

type typedError struct{ typ, msg string }

func (e typedError) Error() string     { return e.msg }
func (e typedError) ErrorType() string { return e.typ }

func gatewayDown() error { return typedError{"gateway_down", "gateway: 503 service unavailable"} }

func newFixture(t *testing.T, mutate func(*console.Config)) *fixture {
	t.Helper()
	r := testenv.NewRabbit(t)
	queue := testenv.Name("test.console")
	r.DeleteQueues(queue, topology.DLQ(queue), topology.Archive(queue))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{r.URL}})
	require.NoError(t, err)
	require.NoError(t, b.DeclareQueue(ctx, queue))
	require.NoError(t, b.Close())
	conn, err := amqp091.Dial(r.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	audit := testenv.Name("test.console.audit")
	r.DeleteQueues(audit)
	t.Cleanup(func() {
		if ch, err := r.Conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(audit, false, false)
			_ = ch.Close()
		}
	})
	cfg := console.Config{Conn: conn, Queues: []string{queue, "not.sluice.queue"}, Secrets: []string{r.URL}, Timeout: 20 * time.Second, AuditExchange: audit}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := console.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	return &fixture{rabbit: r, queue: queue, audit: audit, srv: srv, console: c}
}

type noDeadLetterer struct{}

func (noDeadLetterer) DeadLetter(context.Context, string, *message.Message) error {
	return errors.New("not used")
}

// deadLetter puts a message with id, payload and extra headers into the DLQ with the
// failure record package poison writes.
func (fx *fixture) deadLetter(t *testing.T, id, payload string, err error, md map[string]string) {
	t.Helper()
	p := carry.New(carry.Carrier{Host: "worker-1"})
	msg := message.NewMessage(id, []byte(payload))
	msg.Metadata.Set(sluice.HeaderRetryCount, strconv.Itoa(3))
	for k, v := range md {
		msg.Metadata.Set(k, v)
	}
	fx.publishRecord(t, p.Record(msg, fx.queue, sluice.RetryCount(msg.Metadata), err))
}

// publishRecord puts rec, a failure record, into the DLQ.
func (fx *fixture) publishRecord(t *testing.T, rec *message.Message) {
	t.Helper()
	rec.Metadata.Set(headers.Handler, "payments")
	pub, err := amqp.Marshaler{}.Marshal(rec)
	require.NoError(t, err)
	fx.rabbit.Publish(topology.DLQ(fx.queue), pub)
}

// get fetches path and returns the status and body.
func (fx *fixture) get(t *testing.T, path string) (int, string) {
	t.Helper()
	return fx.do(t, http.MethodGet, path, "", nil)
}

func (fx *fixture) do(t *testing.T, method, path, body string, header http.Header) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = stringsReader(body)
	}
	req, err := http.NewRequest(method, fx.srv.URL+path, rd)
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}
