package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// traceTestdata holds traces recorded from Jaeger and their waterfalls.
var traceTestdata = filepath.Join("..", "..", "internal", "waterfall", "testdata")

// fakeJaeger serves Jaeger's query API from the waterfall package's recorded traces:
// /api/services, /api/traces/{id}, and /api/traces searched by messaging.message.id.
type fakeJaeger struct {
	srv      *httptest.Server
	traces   map[string]json.RawMessage   // trace ID -> wire trace
	messages map[string][]json.RawMessage // message ID -> wire traces, in serving order

	mu       sync.Mutex
	searches []url.Values
}

func newFakeJaeger(t *testing.T) *fakeJaeger {
	t.Helper()
	f := &fakeJaeger{traces: map[string]json.RawMessage{}, messages: map[string][]json.RawMessage{}}
	load := func(name string) json.RawMessage {
		body, err := os.ReadFile(filepath.Join(traceTestdata, name+".json"))
		require.NoError(t, err)
		var resp struct {
			Data []json.RawMessage `json:"data"`
		}
		require.NoError(t, json.Unmarshal(body, &resp))
		require.Len(t, resp.Data, 1)
		var head struct {
			TraceID string `json:"traceID"`
		}
		require.NoError(t, json.Unmarshal(resp.Data[0], &head))
		f.traces[head.TraceID] = resp.Data[0]
		return resp.Data[0]
	}
	retried, dead := load("retried"), load("dead_lettered")
	f.messages["pay-1001"] = []json.RawMessage{retried}
	f.messages["pay-1002"] = []json.RawMessage{dead}
	// Served newest first: the command must order them.
	f.messages["pay-twice"] = []json.RawMessage{dead, retried}

	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeJaeger) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	write := func(status int, data any) {
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(data)
	}
	switch {
	case r.URL.Path == "/api/services":
		write(http.StatusOK, map[string]any{"data": []string{"payments", "ledger"}})
	case strings.HasPrefix(r.URL.Path, "/api/traces/"):
		if tr, ok := f.traces[strings.TrimPrefix(r.URL.Path, "/api/traces/")]; ok {
			write(http.StatusOK, map[string]any{"data": []json.RawMessage{tr}})
			return
		}
		write(http.StatusNotFound, map[string]any{"data": nil, "errors": []map[string]any{{"code": 404, "msg": "trace not found"}}})
	case r.URL.Path == "/api/traces":
		q := r.URL.Query()
		f.mu.Lock()
		f.searches = append(f.searches, q)
		f.mu.Unlock()
		var tags map[string]string
		_ = json.Unmarshal([]byte(q.Get("tags")), &tags)
		id := tags["messaging.message.id"]
		if id == "make-jaeger-fail" {
			write(http.StatusInternalServerError, map[string]any{"errors": []map[string]any{{"code": 500, "msg": "storage is down"}}})
			return
		}
		found := []json.RawMessage{}
		if q.Get("service") == "payments" {
			found = append(found, f.messages[id]...)
		}
		write(http.StatusOK, map[string]any{"data": found})
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeJaeger) lastSearch() url.Values {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.searches) == 0 {
		return nil
	}
	return f.searches[len(f.searches)-1]
}

// runTraceCLI runs the CLI in-process with the given environment.
func runTraceCLI(environ map[string]string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut, now: time.Now, getenv: func(k string) string { return environ[k] }}
	code = run(context.Background(), e, args)
	return code, out.String(), errOut.String()
}

func readGolden(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(traceTestdata, name+".golden"))
	require.NoError(t, err)
	return string(b)
}

func TestTrace_Draws(t *testing.T) {
	f := newFakeJaeger(t)
	cases := []struct {
		name       string
		args       []string
		wantGolden string // the whole stdout is this waterfall
		wantStdout []string
	}{
		{name: "by message id", args: []string{"pay-1002"}, wantGolden: "dead_lettered"},
		{name: "by trace id", args: []string{"d27462caee75b87063287339e0ae6a58"}, wantGolden: "dead_lettered"},
		{name: "by trace id in upper case", args: []string{"D27462CAEE75B87063287339E0AE6A58"}, wantGolden: "dead_lettered"},
		{name: "flags after the id", args: []string{"pay-1001", "--width", "80"}, wantGolden: "retried_wide"},
		{name: "id after --", args: []string{"--service", "payments", "--", "pay-1001"}, wantGolden: "retried"},
		{
			name: "a message in two traces, oldest first", args: []string{"pay-twice"},
			wantStdout: []string{"Message pay-twice is in 2 traces, oldest first.\n\nTrace 6a121309b0d2f7efb5fa59e27e13366f", "\n\nTrace d27462caee75b87063287339e0ae6a58"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runTraceCLI(map[string]string{"JAEGER_QUERY_URL": f.srv.URL}, append([]string{"trace"}, tc.args...)...)
			require.Equal(t, exitOK, code, "stderr:\n%s", stderr)
			assert.Empty(t, stderr)
			if tc.wantGolden != "" {
				assert.Equal(t, readGolden(t, tc.wantGolden), stdout)
			}
			for _, w := range tc.wantStdout {
				assert.Contains(t, stdout, w)
			}
		})
	}
}

func TestTrace_SearchParameters(t *testing.T) {
	f := newFakeJaeger(t)
	cases := []struct {
		name        string
		environ     map[string]string
		args        []string
		wantService string
		wantWindow  time.Duration
	}{
		{name: "defaults", args: []string{"pay-1001"}, wantService: "payments", wantWindow: 24 * time.Hour},
		{name: "OTEL_SERVICE_NAME", environ: map[string]string{"OTEL_SERVICE_NAME": "ledger"}, args: []string{"pay-1001"}, wantService: "ledger", wantWindow: 24 * time.Hour},
		{name: "flags win", environ: map[string]string{"OTEL_SERVICE_NAME": "ledger"}, args: []string{"--service", "payments", "--lookback", "2h", "pay-1001"}, wantService: "payments", wantWindow: 2 * time.Hour},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			environ := map[string]string{"JAEGER_QUERY_URL": f.srv.URL}
			for k, v := range tc.environ {
				environ[k] = v
			}
			_, _, stderr := runTraceCLI(environ, append([]string{"trace"}, tc.args...)...)
			q := f.lastSearch()
			require.NotNil(t, q, "searched; stderr:\n%s", stderr)
			assert.Equal(t, tc.wantService, q.Get("service"))
			assert.JSONEq(t, `{"messaging.message.id":"pay-1001"}`, q.Get("tags"))
			start, err := strconv.ParseInt(q.Get("start"), 10, 64)
			require.NoError(t, err)
			end, err := strconv.ParseInt(q.Get("end"), 10, 64)
			require.NoError(t, err)
			assert.Equal(t, tc.wantWindow, time.Duration(end-start)*time.Microsecond)
		})
	}
}

func TestTrace_Failures(t *testing.T) {
	f := newFakeJaeger(t)
	const secret = "s3cr3t-pw"
	cases := []struct {
		name       string
		url        string
		args       []string
		wantCode   int
		wantStderr string
		wantStdout string
	}{
		{name: "no argument", args: nil, wantCode: exitUsage, wantStderr: "want exactly one message id or trace id, got 0 arguments"},
		{name: "two arguments", args: []string{"a", "b"}, wantCode: exitUsage, wantStderr: "got 2 arguments"},
		{name: "empty id", args: []string{" "}, wantCode: exitUsage, wantStderr: "is empty"},
		{name: "bad lookback", args: []string{"--lookback", "0s", "x"}, wantCode: exitUsage, wantStderr: "--lookback must be positive"},
		{name: "narrow width", args: []string{"--width", "5", "x"}, wantCode: exitUsage, wantStderr: "--width must be at least 10"},
		{name: "unknown flag", args: []string{"--bogus", "x"}, wantCode: exitUsage, wantStderr: "flag provided but not defined: -bogus"},
		{name: "help", args: []string{"-h"}, wantCode: exitOK, wantStdout: "Usage: sluice trace [--service S] [--lookback D] [--width N] <message-id | trace-id>"},
		{name: "unknown message", args: []string{"nope"}, wantCode: exitNotFound, wantStderr: `no trace of message nope in service "payments" within the last 24h0m0s`},
		{name: "unknown trace id", args: []string{"00000000000000000000000000000001"}, wantCode: exitNotFound, wantStderr: "no trace 00000000000000000000000000000001 (nor of a message with that id)"},
		{name: "unknown service", args: []string{"--service", "paymnets", "pay-1001"}, wantCode: exitNotFound, wantStderr: `has no spans of service "paymnets" (it has: ledger, payments)`},
		{name: "Jaeger unreachable", url: "http://127.0.0.1:1", args: []string{"pay-1001"}, wantCode: exitFailed, wantStderr: "sluice trace: cannot reach Jaeger's query API at http://127.0.0.1:1"},
		{name: "Jaeger unreachable, password masked", url: "http://ops:" + secret + "@127.0.0.1:1", args: []string{"pay-1001"}, wantCode: exitFailed, wantStderr: "http://ops:xxxxx@127.0.0.1:1"},
		{name: "Jaeger failing", args: []string{"make-jaeger-fail"}, wantCode: exitFailed, wantStderr: "storage is down"},
		{name: "not Jaeger", url: f.srv.URL + "/not-jaeger", args: []string{"pay-1001"}, wantCode: exitFailed, wantStderr: "cannot reach Jaeger's query API"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := tc.url
			if u == "" {
				u = f.srv.URL
			}
			code, stdout, stderr := runTraceCLI(map[string]string{"JAEGER_QUERY_URL": u}, append([]string{"trace"}, tc.args...)...)
			assert.Equal(t, tc.wantCode, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			assert.Contains(t, stderr, tc.wantStderr)
			assert.Contains(t, stdout, tc.wantStdout)
			assert.NotContains(t, stderr+stdout, secret)
		})
	}
}

func TestTrace_IsListed(t *testing.T) {
	code, stdout, _ := runTraceCLI(nil, "help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stdout, "trace    draw a message's life")
}
