package console_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/internal/otelstep"
	"github.com/sluice-go/sluice/internal/stackview"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

// journalState is the stack's idempotency journal figures, as its metrics report them.
func journalState(s *router.Stack) (otelstep.JournalState, bool) {
	v, _ := stackview.Of(s)
	return v.Journal()
}

// journalStack is a stack on RabbitMQ whose idempotency step journals handler payments'
// done keys on queue's stream, as the payments service's does.
type journalStack struct {
	stack   *router.Stack
	handled chan string
	done    chan error
}

func startJournalStack(t *testing.T, url, queue string, operate func(*router.Stack, *amqp.Broker)) *journalStack {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{url}, Logger: logger})
	require.NoError(t, err)
	guard, err := idempotency.New(idempotency.Config{Logger: logger})
	require.NoError(t, err)
	s, err := router.New(b, router.Config{Logger: logger, Guard: guard, CloseTimeout: time.Second})
	require.NoError(t, err)
	js := &journalStack{stack: s, handled: make(chan string, 100), done: make(chan error, 1)}
	require.NoError(t, s.Handle("payments", queue, func(msg *message.Message) error {
		js.handled <- msg.UUID
		return nil
	}))
	if operate != nil {
		operate(s, b)
	}
	runCtx, stop := context.WithCancel(context.Background())
	go func() { js.done <- s.Run(runCtx) }()
	closed := false
	closeAll := func() {
		if closed {
			return
		}
		closed = true
		stop()
		<-js.done
		_ = s.Close()
		_ = guard.Close()
		_ = b.Close()
	}
	t.Cleanup(closeAll)
	<-s.Running()
	return js
}

// The journal page against a real stack on RabbitMQ: a first instance handles and
// journals five payments and stops; the next restores their keys from the stream before
// it handles anything, and the page shows what its own metrics server reports (the
// exporter otelsetup.Operate wires, as the payments service's METRICS_ADDR serves it):
// five keys restored, the journal ready, the handler and its stream named.
func TestJournalPage_RealStackOnRabbitMQ(t *testing.T) {
	r := testenv.NewRabbit(t)
	queue := testenv.Name("test.console.journal")
	journal := topology.IdempotencyJournal(queue)
	r.DeleteQueues(queue, topology.DLQ(queue), journal)
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")

	first := startJournalStack(t, r.URL, queue, nil)
	const n = 5
	for i := range n {
		r.Publish(queue, amqp091.Publishing{MessageId: fmt.Sprintf("pay-%d", i), DeliveryMode: amqp091.Persistent, Body: []byte(`{}`)})
	}
	for range n {
		select {
		case <-first.handled:
		case <-time.After(30 * time.Second):
			t.Fatal("the first instance did not handle the payments")
		}
	}
	require.Eventually(t, func() bool {
		st, ok := journalState(first.stack)
		return ok && st.Appended >= n && st.Unconfirmed == 0
	}, 30*time.Second, 50*time.Millisecond, "the keys are journaled")
	require.NoError(t, first.stack.Close())

	// The next instance, with its metrics server.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	providers, err := otelsetup.Setup(ctx, otelsetup.Config{ServiceName: "journal-console-rabbit",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = providers.Shutdown(context.Background()) })
	second := startJournalStack(t, r.URL, queue, func(s *router.Stack, _ *amqp.Broker) {
		require.NoError(t, providers.Operate(s))
	})
	require.Eventually(t, func() bool {
		st, ok := journalState(second.stack)
		return ok && st.Restoring == 0 && st.Restored >= n
	}, 30*time.Second, 50*time.Millisecond, "the second instance restores the keys")
	mux := http.NewServeMux()
	mux.Handle("/metrics", providers.MetricsHandler())
	mux.Handle(otelsetup.DebugPrefix, providers.DebugHandler())
	service := httptest.NewServer(mux)
	t.Cleanup(service.Close)

	fx := newFixture(t, func(c *console.Config) { c.ServiceURL = service.URL })
	code, body := fx.get(t, "/journal")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Read from the service at "+service.URL+"/metrics.")
	assert.Contains(t, body, `<td><code>`+journal+`</code></td>`)
	row := journalRow(t, body, "this service")
	assert.Equal(t, "payments", row["handlers"])
	assert.Equal(t, "ready", row["state"])
	assert.Equal(t, fmt.Sprint(n), row["restored-keys"])
	assert.Equal(t, "0", row["failures"])
	assert.Equal(t, "0", row["skipped"])
	assert.NotEqual(t, "0s", row["restore-duration"], "a restore from the stream takes some time")
}
