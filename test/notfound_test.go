package test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/telemetry"
)

// Issue 35: amqp.ErrQueueNotFound, dlq.ErrQueueNotFound and telemetry.ErrQueueAbsent
// were three errors for one fact. Every path that reads a missing queue now wraps
// sluice.ErrQueueNotFound, on RabbitMQ itself (the management API's 404 comes from a
// stand-in server; test/observe_test.go reads a real one).
func TestErrQueueNotFound_OneSentinelFromEveryPackage(t *testing.T) {
	r := testenv.NewRabbit(t)
	missing := testenv.Name("notfound.missing")
	r.DeleteQueues(missing, missing+".dlq")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{r.URL}, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	mgmt := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(mgmt.Close)
	ms, err := telemetry.NewManagementSource(mgmt.URL, "")
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		read func() error
	}{
		{"amqp.Broker.QueueDepth", func() error { _, err := b.QueueDepth(ctx, missing); return err }},
		{"dlq.Inspector.Stats", func() error { _, err := dlq.Inspector{Conn: r.Conn}.Stats(ctx, missing); return err }},
		{"dlq.Inspector.Messages", func() error {
			_, err := dlq.Inspector{Conn: r.Conn}.Messages(ctx, missing, dlq.Selector{}, func(dlq.Record) bool { return true })
			return err
		}},
		{"telemetry.ManagementSource.QueueDepth", func() error { _, err := ms.QueueDepth(ctx, missing); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.read()
			require.ErrorIs(t, err, sluice.ErrQueueNotFound)
			assert.Contains(t, err.Error(), missing, "the error names the queue")
		})
	}
}
