package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// TestManagementAPI runs a node of its own with the management plugin: the overview lists
// the vhost's queues that have a Q.dlq without being told their names, with their
// unacknowledged counts; an unreachable management API leaves the AMQP counts and says why.
func TestManagementAPI(t *testing.T) {
	mgmtPort := testenv.FreePort(t)
	node := testenv.StartNode(t, testenv.NodeOptions{
		Plugins: []string{"rabbitmq_management"},
		Config: []string{
			fmt.Sprintf("management.tcp.port = %d", mgmtPort),
			"management.tcp.ip = 127.0.0.1",
			"collect_statistics_interval = 500",
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	queue := testenv.Name("test.console.mgmt")
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{node.URL()}})
	require.NoError(t, err)
	require.NoError(t, b.DeclareQueue(ctx, queue))
	require.NoError(t, b.Close())
	r := node.Rabbit(t)
	r.Publish(queue, amqp091.Publishing{Body: []byte("one")})
	r.Publish(queue, amqp091.Publishing{Body: []byte("two")})
	// One message delivered and not acknowledged: only the management API sees it.
	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	require.NoError(t, ch.Qos(1, 0, false))
	_, err = ch.Consume(queue, "", false, false, false, false, nil)
	require.NoError(t, err)

	conn, err := amqp091.Dial(node.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	serve := func(mgmtURL string) *httptest.Server {
		c, err := console.New(console.Config{Conn: conn, ManagementURL: mgmtURL, Secrets: []string{node.URL(), mgmtURL}})
		require.NoError(t, err)
		srv := httptest.NewServer(c)
		t.Cleanup(srv.Close)
		return srv
	}
	type overview struct {
		Queues []struct {
			Queue     string `json:"queue"`
			Ready     int    `json:"ready"`
			Unacked   *int   `json:"unacked"`
			Consumers int    `json:"consumers"`
		} `json:"queues"`
		ManagementError string `json:"management_error"`
	}
	read := func(srv *httptest.Server) (overview, string) {
		resp, err := http.Get(srv.URL + "/api/v1/queues")
		require.NoError(t, err)
		defer resp.Body.Close()
		var ov overview
		var raw json.RawMessage
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&raw))
		require.NoError(t, json.Unmarshal(raw, &ov))
		return ov, string(raw)
	}

	srv := serve(fmt.Sprintf("http://guest:guest@127.0.0.1:%d/", mgmtPort))
	var ov overview
	var raw string
	require.Eventually(t, func() bool {
		ov, raw = read(srv)
		return len(ov.Queues) == 1 && ov.Queues[0].Unacked != nil && *ov.Queues[0].Unacked == 1
	}, 60*time.Second, 250*time.Millisecond, "the queue with one unacknowledged message: %s", raw)
	assert.Equal(t, queue, ov.Queues[0].Queue, "found without --queue")
	assert.Equal(t, 1, ov.Queues[0].Ready)
	assert.Equal(t, 1, ov.Queues[0].Consumers)
	assert.Empty(t, ov.ManagementError)
	assert.NotContains(t, raw, "guest:guest")

	down := serve("http://guest:s3cret@127.0.0.1:1/")
	ov, raw = read(down)
	assert.Contains(t, ov.ManagementError, "management API at http://127.0.0.1:1/: ")
	assert.False(t, strings.Contains(raw, "s3cret"), raw)
}
