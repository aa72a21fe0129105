package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// startConsole runs `sluice console args...` in-process until the test ends and returns
// its base URL and output.
func startConsole(t *testing.T, vars map[string]string, args ...string) (base string, stdout *testenv.SyncBuffer) {
	t.Helper()
	var out, errOut testenv.SyncBuffer
	e := &env{stdout: &out, stderr: &errOut, now: time.Now, getenv: func(k string) string { return vars[k] }}
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() { code <- run(ctx, e, append([]string{"console"}, args...)) }()
	t.Cleanup(func() {
		cancel()
		assert.Equal(t, exitOK, <-code, errOut.String())
	})
	re := regexp.MustCompile(`http://(\S+)/`)
	require.Eventually(t, func() bool { return re.MatchString(out.String()) }, 15*time.Second, 20*time.Millisecond, "no address printed: %s", errOut.String())
	return "http://" + re.FindStringSubmatch(out.String())[1], &out
}

func fetch(t *testing.T, url string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header = header
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestConsoleRefusesAnOpenAddressWithoutAToken(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:8090"} {
		t.Run(addr, func(t *testing.T) {
			code, _, stderr := runIn("amqp://guest:guest@127.0.0.1:1/", "console", "--addr", addr)
			assert.Equal(t, exitUsage, code)
			assert.Contains(t, stderr, "set SLUICE_CONSOLE_TOKEN")
		})
	}
	code, stdout, _ := runIn("", "console", "-h")
	assert.Equal(t, exitOK, code)
	for _, want := range []string{"SLUICE_CONSOLE_TOKEN", "SLUICE_CONSOLE_READ_TOKEN", "RABBITMQ_MANAGEMENT_URL", "port 15672", "rabbitmq_management", "alice:s1,bob:s2"} {
		assert.Contains(t, stdout, want)
	}
	code, stdout, _ = runIn("", "help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stdout, "console  serve the operator console")
	code, _, stderr := runIn("", "console", "--addr", "nonsense")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, `--addr "nonsense"`)
}

func TestConsoleOnLoopback(t *testing.T) {
	amqpURL := testenv.AMQPURL(t)
	base, out := startConsole(t, map[string]string{"AMQP_URL": amqpURL, "JAEGER_QUERY_URL": "off"}, "--addr", "127.0.0.1:0", "--queue", "some.queue")
	assert.Contains(t, out.String(), "(this machine only)")
	assert.NotContains(t, out.String(), "guest:guest", "the AMQP password is masked")
	code, body := fetch(t, base+"/api/v1/queues", nil)
	assert.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, "guest:guest")
}

func TestConsoleOnAnOpenAddressNeedsTheToken(t *testing.T) {
	amqpURL := testenv.AMQPURL(t)
	base, out := startConsole(t, map[string]string{"AMQP_URL": amqpURL, "SLUICE_CONSOLE_TOKEN": "tok-123"}, "--addr", "0.0.0.0:0")
	assert.Contains(t, out.String(), "every request must carry SLUICE_CONSOLE_TOKEN")
	assert.NotContains(t, out.String(), "tok-123")
	code, _ := fetch(t, base+"/api/v1/queues", nil)
	assert.Equal(t, http.StatusUnauthorized, code)
	code, body := fetch(t, base+"/api/v1/queues", http.Header{"Authorization": {"Bearer tok-123"}})
	assert.Equal(t, http.StatusOK, code, body)
}

// TestConsoleTokenSyntax: a token list that does not parse is a usage error that never
// quotes a secret, checked before any connection.
func TestConsoleTokenSyntax(t *testing.T) {
	cases := []struct{ name, variable, value string }{
		{"operator: empty secret", "SLUICE_CONSOLE_TOKEN", "good-s3cret,alice:"},
		{"operator: empty name", "SLUICE_CONSOLE_TOKEN", ":good-s3cret"},
		{"reader: empty secret", "SLUICE_CONSOLE_READ_TOKEN", "good-s3cret,carol:"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut testenv.SyncBuffer
			e := &env{stdout: &out, stderr: &errOut, now: time.Now, getenv: func(k string) string {
				switch k {
				case "AMQP_URL":
					return "amqp://guest:guest@127.0.0.1:1/"
				case tc.variable:
					return tc.value
				}
				return ""
			}}
			code := run(context.Background(), e, []string{"console"})
			assert.Equal(t, exitUsage, code)
			assert.Contains(t, errOut.String(), tc.variable+": console: bad token")
			assert.NotContains(t, errOut.String()+out.String(), "good-s3cret")
		})
	}
}

// TestConsoleAccess: SLUICE_CONSOLE_TOKEN and SLUICE_CONSOLE_READ_TOKEN through the
// command, on an open address: a read token alone is enough to listen there, reads
// everything and may not act; named tokens say who is signed in.
func TestConsoleAccess(t *testing.T) {
	amqpURL := testenv.AMQPURL(t)
	t.Run("read token only", func(t *testing.T) {
		base, out := startConsole(t, map[string]string{"AMQP_URL": amqpURL, "JAEGER_QUERY_URL": "off", "SLUICE_CONSOLE_READ_TOKEN": "carol:r-s3cret"}, "--addr", "0.0.0.0:0", "--queue", "some.queue")
		assert.Contains(t, out.String(), "operators: none; read-only: carol")
		assert.NotContains(t, out.String(), "r-s3cret")
		code, body := fetch(t, base+"/api/v1/queues", http.Header{"Authorization": {"Bearer r-s3cret"}})
		assert.Equal(t, http.StatusOK, code, body)
		code, body = fetch(t, base+"/", http.Header{"Authorization": {"Bearer r-s3cret"}})
		assert.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, "signed in as <strong>carol</strong> (read-only)")
		code, body = post(t, base+"/api/v1/queues/some.queue/replay", http.Header{"Authorization": {"Bearer r-s3cret"}})
		assert.Equal(t, http.StatusForbidden, code, body)
		assert.Contains(t, body, "read-only")
		assert.Contains(t, body, "SLUICE_CONSOLE_TOKEN")
		code, _ = fetch(t, base+"/api/v1/queues", nil)
		assert.Equal(t, http.StatusUnauthorized, code)
	})
	t.Run("named operators and readers", func(t *testing.T) {
		base, out := startConsole(t, map[string]string{"AMQP_URL": amqpURL, "JAEGER_QUERY_URL": "off",
			"SLUICE_CONSOLE_TOKEN": "alice:s1-secret,bob:s2-secret", "SLUICE_CONSOLE_READ_TOKEN": "r-secret"}, "--addr", "127.0.0.1:0", "--queue", "some.queue")
		assert.Contains(t, out.String(), "operators: alice, bob; read-only: reader")
		for token, want := range map[string]string{"s1-secret": "alice</strong> (operator)", "s2-secret": "bob</strong> (operator)", "r-secret": "reader</strong> (read-only)"} {
			code, body := fetch(t, base+"/", http.Header{"Authorization": {"Bearer " + token}})
			assert.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, "signed in as <strong>"+want)
			assert.NotContains(t, body, "No access control")
		}
		// An operator's POST passes access control (and is refused further on, for its
		// missing CSRF header).
		code, body := post(t, base+"/api/v1/queues/some.queue/replay", http.Header{"Authorization": {"Bearer s1-secret"}})
		assert.Equal(t, http.StatusForbidden, code, body)
		assert.Contains(t, body, "X-CSRF-Token")
		assert.NotContains(t, body, "read-only")
	})
	t.Run("no token on loopback", func(t *testing.T) {
		base, out := startConsole(t, map[string]string{"AMQP_URL": amqpURL, "JAEGER_QUERY_URL": "off"}, "--addr", "127.0.0.1:0", "--queue", "some.queue")
		assert.Contains(t, out.String(), "no access control: anyone on this machine can act")
		code, body := fetch(t, base+"/", nil)
		assert.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, "No access control: loopback only, anyone on this machine can act")
		assert.Contains(t, body, "signed in as <strong>loopback</strong> (operator)")
	})
}

func post(t *testing.T, url string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"ids":["x"]}`))
	require.NoError(t, err)
	req.Header = header
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestConsoleDiscoversQueues: without --queue and RABBITMQ_MANAGEMENT_URL the console
// finds the queues with a Q.dlq through the management API on AMQP_URL's host, port
// 15672. It needs a node with the management plugin there, which the shared broker may
// not have (and is not ours to change): so it starts a node of its own, with AMQP and the
// management API on 127.0.0.2, a loopback address of its own.
func TestConsoleDiscoversQueues(t *testing.T) {
	const host = "127.0.0.2"
	// The port is fixed: make test's two parts run this package side by side.
	testenv.Lock(t, host+":15672")
	amqpPort := testenv.FreePort(t)
	node := testenv.StartNode(t, testenv.NodeOptions{
		Plugins: []string{"rabbitmq_management"},
		Config: []string{
			fmt.Sprintf("listeners.tcp.2 = %s:%d", host, amqpPort),
			"management.tcp.ip = " + host,
			"management.tcp.port = 15672",
		},
	})
	amqpURL := fmt.Sprintf("amqp://guest:guest@%s:%d/", host, amqpPort)
	discoversQueues(t, amqpURL, node.URL())
}

// discoversQueues declares test-disc-<random> and its .dlq on the node at amqpURL (reached
// for the declarations at adminURL), runs the console with only AMQP_URL, and finds the
// queue on the overview, discovered at amqpURL's host, port 15672.
func discoversQueues(t *testing.T, amqpURL, adminURL string) {
	t.Helper()
	conn, err := amqp091.Dial(adminURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	queue := fmt.Sprintf("test-disc-%d", rand.Int64())
	for _, q := range []string{queue, queue + ".dlq"} {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		for _, q := range []string{queue, queue + ".dlq"} {
			_, err := ch.QueueDelete(q, false, false, false)
			assert.NoError(t, err)
		}
		_ = ch.Close()
	})

	base, out := startConsole(t, map[string]string{"AMQP_URL": amqpURL, "JAEGER_QUERY_URL": "off"}, "--addr", "127.0.0.1:0")
	u, err := url.Parse(amqpURL)
	require.NoError(t, err)
	masked := "http://guest:xxxxx@" + u.Hostname() + ":15672"
	assert.Contains(t, out.String(), "discovering queues through the management API at "+masked)
	var body string
	require.Eventually(t, func() bool {
		_, body = fetch(t, base+"/api/v1/queues", nil)
		return strings.Contains(body, `"queue": "`+queue+`"`)
	}, 60*time.Second, 500*time.Millisecond, "the queue is discovered: %s", body)
	assert.Contains(t, body, `"discovered_at": "`+masked+`"`)
	assert.NotContains(t, body, "discovery_error")
	code, page := fetch(t, base+"/", nil)
	assert.Equal(t, http.StatusOK, code, page)
	assert.Contains(t, page, `href="/queues/`+queue+`"`)
	assert.Contains(t, page, "Queues discovered through RabbitMQ's management API at <code>"+masked+"</code>")
	assert.NotContains(t, page, "guest:guest")
}

// TestConsoleRetriesSource: the console's retry pages read the same variables as sluice
// retries and sluice policy, and its start-up output says where.
func TestConsoleRetriesSource(t *testing.T) {
	amqpURL := testenv.AMQPURL(t)
	service := fakeService(t)
	prom := newFakePrometheus(t)
	tests := []struct {
		name       string
		vars       map[string]string
		wantOut    string
		wantSource string
		wantURL    string
	}{
		{name: "the service", vars: map[string]string{"SLUICE_SERVICE_URL": strings.Replace(service, "http://", "http://ops:s3cr3tpw@", 1)},
			wantOut:    "retry statistics from the service at " + strings.Replace(service, "http://", "http://ops:xxxxx@", 1) + retriesPath,
			wantSource: sourceService, wantURL: strings.Replace(service, "http://", "http://ops:xxxxx@", 1) + retriesPath + "?handler=pay"},
		{name: "Prometheus", vars: map[string]string{"SLUICE_SERVICE_URL": service, "PROMETHEUS_URL": prom.srv.URL},
			wantOut: "retry statistics from Prometheus at " + prom.srv.URL, wantSource: sourcePrometheus, wantURL: prom.srv.URL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vars := map[string]string{"AMQP_URL": amqpURL, "JAEGER_QUERY_URL": "off"}
			for k, v := range tc.vars {
				vars[k] = v
			}
			base, out := startConsole(t, vars, "--addr", "127.0.0.1:0", "--queue", "some.queue")
			// startConsole returns once the address is printed; the source line follows it.
			assert.Eventually(t, func() bool { return strings.Contains(out.String(), tc.wantOut) }, 5*time.Second, 10*time.Millisecond,
				"want %q in the start-up output", tc.wantOut)
			code, body := fetch(t, base+"/api/v1/retries?handler=pay", nil)
			require.Equal(t, http.StatusOK, code, body)
			var r retriesReport
			require.NoError(t, json.Unmarshal([]byte(body), &r))
			assert.Equal(t, tc.wantSource, r.Source)
			assert.Equal(t, tc.wantURL, r.URL)
			require.NotEmpty(t, r.Types)
			assert.Equal(t, "pay", r.Types[0].Handler)
			code, body = fetch(t, base+"/policy/pay", nil)
			require.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, "cli.pay.dlq")
			assert.NotContains(t, out.String()+body, "s3cr3tpw")
		})
	}
}
