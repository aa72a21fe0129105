package console_test

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/internal/topology"
)

func TestDiscoveryTarget(t *testing.T) {
	cases := []struct {
		name, amqpURL, wantURL, wantVHost string
	}{
		{"host, port and vhost", "amqp://u:p@h:5672/v", "http://u:p@h:15672", "v"},
		{"the default URL", "amqp://guest:guest@127.0.0.1:5672/", "http://guest:guest@127.0.0.1:15672", "/"},
		{"no port, no vhost", "amqp://u:p@rabbit", "http://u:p@rabbit:15672", "/"},
		{"no credentials means AMQP's guest", "amqp://rabbit:5672/", "http://guest:guest@rabbit:15672", "/"},
		{"escaped vhost", "amqp://u:p@h:5672/%2Fstaging", "http://u:p@h:15672", "/staging"},
		{"escaped password", "amqp://u:p%40ss@h:5672/", "http://u:p%40ss@h:15672", "/"},
		{"amqps is still http on 15672", "amqps://u:p@h:5671/v", "http://u:p@h:15672", "v"},
		{"IPv6", "amqp://u:p@[::1]:5672/", "http://u:p@[::1]:15672", "/"},
		{"spaces around", " amqp://u:p@h:5672/v ", "http://u:p@h:15672", "v"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, vhost, err := console.DiscoveryTarget(tc.amqpURL)
			require.NoError(t, err)
			assert.Equal(t, tc.wantURL, got)
			assert.Equal(t, tc.wantVHost, vhost)
		})
	}
	for _, bad := range []string{"http://u:s3cret@h:5672/", "amqp://u:s3cret@:5672/", "amqp://u:s3cret@h:port/"} {
		t.Run("refuses "+bad, func(t *testing.T) {
			_, _, err := console.DiscoveryTarget(bad)
			require.Error(t, err)
			assert.NotContains(t, err.Error(), "s3cret")
		})
	}
}

// fakeManagement stands in for RabbitMQ's management API: GET /api/queues/%2F lists
// queues, with user guest and password pw. It counts the calls; fail makes it answer 503.
type fakeManagement struct {
	srv   *httptest.Server
	calls atomic.Int32
	fail  atomic.Bool
}

func newFakeManagement(t *testing.T, pw string, queues ...string) *fakeManagement {
	t.Helper()
	f := &fakeManagement{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		if u, p, ok := r.BasicAuth(); !ok || u != "guest" || p != pw {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if f.fail.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		if r.URL.EscapedPath() != "/api/queues/%2F" {
			http.NotFound(w, r)
			return
		}
		list := []map[string]any{}
		for _, q := range queues {
			list = append(list, map[string]any{"name": q, "messages_ready": 0, "messages_unacknowledged": 2, "consumers": 0})
		}
		_ = json.NewEncoder(w).Encode(list)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// url is the fake's address with guest and pw in it.
func (f *fakeManagement) url(pw string) string {
	return "http://guest:" + pw + "@" + strings.TrimPrefix(f.srv.URL, "http://")
}

// TestDiscoveredQueues: the overview lists what a management API lists, whether named
// (ManagementURL) or discovered (DiscoveryURL); only the latter says it was discovered,
// and where, with the password masked.
func TestDiscoveredQueues(t *testing.T) {
	const pw = "mgmt-s3cret"
	for _, tc := range []struct {
		name       string
		configure  func(c *console.Config, mgmtURL string)
		discovered bool
	}{
		{"RABBITMQ_MANAGEMENT_URL", func(c *console.Config, u string) { c.ManagementURL = u }, false},
		{"discovery", func(c *console.Config, u string) { c.DiscoveryURL = u }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t, nil)
			// Once the fixture names its queue, serve a console of our own on its
			// connection, with the fake listing the queue, its DLQ and a queue without one.
			mgmt := newFakeManagement(t, pw, fx.queue, topology.DLQ(fx.queue), "plain.queue")
			srv := serveConsole(t, fx, func(c *console.Config) { tc.configure(c, mgmt.url(pw)) })
			fx.deadLetter(t, "d-1", `{}`, gatewayDown(), nil)

			code, page := get(t, srv.URL+"/")
			require.Equal(t, http.StatusOK, code, page)
			assert.Contains(t, page, `href="/queues/`+fx.queue+`"`)
			assert.Contains(t, page, `<td data-field="unacked">2</td>`)
			assert.NotContains(t, page, "plain.queue")
			assert.NotContains(t, page, pw)
			code, api := get(t, srv.URL+"/api/v1/queues")
			require.Equal(t, http.StatusOK, code, api)
			assert.Contains(t, api, `"queue": "`+fx.queue+`"`)
			assert.NotContains(t, api, pw)
			masked := "http://guest:xxxxx@" + strings.TrimPrefix(mgmt.srv.URL, "http://")
			if tc.discovered {
				assert.Contains(t, page, "Queues discovered through RabbitMQ's management API at <code>"+masked+"</code>")
				assert.Contains(t, api, `"discovered_at": "`+masked+`"`)
			} else {
				assert.NotContains(t, page, "discovered")
				assert.NotContains(t, api, "discovered_at")
			}
		})
	}
}

// serveConsole serves a second console on fx's connection, configured by mutate.
func serveConsole(t *testing.T, fx *fixture, mutate func(*console.Config)) *httptest.Server {
	t.Helper()
	cfg := console.Config{Conn: fx.rabbit.Conn, Secrets: []string{fx.rabbit.URL}, Timeout: 20 * time.Second}
	mutate(&cfg)
	c, err := console.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	return fetchWith(t, http.DefaultClient, u)
}

func fetchWith(t *testing.T, client *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := client.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// deadPort returns an address on 127.0.0.1 where nothing listens.
func deadPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// TestDiscoveryFails: discovery against a port where nothing listens leaves an overview
// that names both remedies and the error, never the AMQP URL's password.
func TestDiscoveryFails(t *testing.T) {
	const amqpURL = "amqp://guest:amqp-s3cret@127.0.0.1:5672/"
	target, _, err := console.DiscoveryTarget(amqpURL)
	require.NoError(t, err)
	u, err := url.Parse(target)
	require.NoError(t, err)
	u.Host = deadPort(t)
	fx := newFixture(t, nil)
	srv := serveConsole(t, fx, func(c *console.Config) {
		c.DiscoveryURL = u.String()
		c.Secrets = append(c.Secrets, amqpURL)
	})

	code, page := get(t, srv.URL+"/")
	require.Equal(t, http.StatusOK, code, page)
	assert.Contains(t, page, "No queue to show")
	assert.Contains(t, page, "<code>--queue Q</code>")
	assert.Contains(t, page, "<code>rabbitmq_management</code>")
	assert.Contains(t, page, "<code>RABBITMQ_MANAGEMENT_URL</code>")
	assert.Contains(t, page, `id="discovery-error"`)
	assert.Contains(t, page, "management API at <code>http://guest:xxxxx@"+u.Host+"</code> failed")
	assert.Contains(t, page, "management API at http://"+u.Host)
	assert.Contains(t, page, "connection refused")
	assert.NotContains(t, page, "amqp-s3cret")
	code, api := get(t, srv.URL+"/api/v1/queues")
	require.Equal(t, http.StatusOK, code, api)
	assert.Contains(t, api, `"discovery_url": "http://guest:xxxxx@`+u.Host+`"`)
	assert.Contains(t, api, `"discovery_error": "management API at http://`+u.Host)
	assert.NotContains(t, api, "amqp-s3cret")
}

// TestDiscoveryFailureIsRemembered: a failed discovery is not tried again on every page
// load, and a management API that hangs slows a page by no more than DiscoveryTimeout.
func TestDiscoveryFailureIsRemembered(t *testing.T) {
	fx := newFixture(t, nil)
	t.Run("failure cached", func(t *testing.T) {
		mgmt := newFakeManagement(t, "pw", fx.queue, topology.DLQ(fx.queue))
		mgmt.fail.Store(true)
		srv := serveConsole(t, fx, func(c *console.Config) { c.DiscoveryURL = mgmt.url("pw") })
		for range 3 {
			_, page := get(t, srv.URL+"/")
			assert.Contains(t, page, "503 Service Unavailable")
		}
		assert.Equal(t, int32(1), mgmt.calls.Load(), "tried once")
		mgmt.fail.Store(false)
		_, page := get(t, srv.URL+"/")
		assert.Contains(t, page, "503 Service Unavailable", "still remembered")
		assert.Equal(t, int32(1), mgmt.calls.Load())
	})
	t.Run("retried after DiscoveryRetry", func(t *testing.T) {
		mgmt := newFakeManagement(t, "pw", fx.queue, topology.DLQ(fx.queue))
		mgmt.fail.Store(true)
		srv := serveConsole(t, fx, func(c *console.Config) { c.DiscoveryURL = mgmt.url("pw"); c.DiscoveryRetry = 200 * time.Millisecond })
		_, page := get(t, srv.URL+"/")
		assert.Contains(t, page, "503 Service Unavailable")
		mgmt.fail.Store(false)
		time.Sleep(300 * time.Millisecond)
		_, page = get(t, srv.URL+"/")
		assert.Contains(t, page, `href="/queues/`+fx.queue+`"`)
		assert.NotContains(t, page, "503 Service Unavailable")
		assert.Equal(t, int32(2), mgmt.calls.Load())
		// Success is not cached: every overview asks the API.
		get(t, srv.URL+"/")
		assert.Equal(t, int32(3), mgmt.calls.Load())
	})
	t.Run("a hanging API costs at most the timeout", func(t *testing.T) {
		release := make(chan struct{})
		hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		t.Cleanup(hang.Close)
		t.Cleanup(func() { close(release) })
		srv := serveConsole(t, fx, func(c *console.Config) {
			c.DiscoveryURL = "http://guest:pw@" + strings.TrimPrefix(hang.URL, "http://")
		})
		start := time.Now()
		_, page := get(t, srv.URL+"/")
		took := time.Since(start)
		assert.Contains(t, page, `id="discovery-error"`)
		assert.Less(t, took, console.DiscoveryTimeout+2*time.Second)
		start = time.Now()
		get(t, srv.URL+"/api/v1/queues")
		assert.Less(t, time.Since(start), time.Second, "the failure is remembered")
	})
}
