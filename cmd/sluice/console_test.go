package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

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
	assert.Contains(t, stdout, "SLUICE_CONSOLE_TOKEN")
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
