package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// sluiceCLI returns the sluice CLI, built once per test process by the project's shared
// helper (a binary in t.TempDir() would vanish with the first test under -count=N).
func sluiceCLI(t *testing.T) string {
	t.Helper()
	return testenv.Binary(t, "./cmd/sluice")
}

// cliRun is one finished run of the CLI.
type cliRun struct {
	stdout, stderr string
	code           int
}

func (r cliRun) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// runSluice runs the CLI with AMQP_URL set to amqpURL and waits for it.
func runSluice(t *testing.T, bin, amqpURL string, args ...string) cliRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "AMQP_URL="+amqpURL)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := cliRun{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		res.code = exit.ExitCode()
	default:
		t.Fatalf("run sluice %v: %v", args, err)
	}
	return res
}

// dlqTypedError gives the test's failures their error types.
type dlqTypedError struct{ typ, msg string }

func (e dlqTypedError) Error() string     { return e.msg }
func (e dlqTypedError) ErrorType() string { return e.typ }

// dlqService is a running stack whose handler fails until healed: messages with ids
// "perm-*" fail permanently (invalid_amount), "defer-*" are deferred once (the attempt not
// used) and then fail like the rest, all others always fail (gateway_down) and are
// dead-lettered once their single retry is used. Healed, it records every message.
type dlqService struct {
	queue  string
	healed atomic.Bool

	mu        sync.Mutex
	processed map[string]int
	last      map[string]message.Metadata
	deferred  map[string]bool
}

func startDLQService(t *testing.T, e *env, queue string) *dlqService {
	t.Helper()
	s := &dlqService{queue: queue, processed: map[string]int{}, last: map[string]message.Metadata{}, deferred: map[string]bool{}}
	cfg := router.Config{Retry: retry.Config{MaxRetries: 1, InitialDelay: 50 * time.Millisecond, Jitter: retry.NoJitter}}
	start(t, e, cfg, func(st *router.Stack) {
		require.NoError(t, st.Handle("dlq-cli", queue, s.handle, router.WithConcurrency(8)))
	})
	return s
}

func (s *dlqService) handle(m *message.Message) error {
	if s.healed.Load() {
		s.mu.Lock()
		s.processed[m.UUID]++
		s.last[m.UUID] = m.Metadata
		s.mu.Unlock()
		return nil
	}
	if strings.HasPrefix(m.UUID, "perm-") {
		return sluice.Permanent(dlqTypedError{"invalid_amount", "amount must be positive: " + m.UUID})
	}
	if strings.HasPrefix(m.UUID, "defer-") {
		s.mu.Lock()
		first := !s.deferred[m.UUID]
		s.deferred[m.UUID] = true
		s.mu.Unlock()
		if first {
			return sluice.Defer(50*time.Millisecond, errors.New("idempotency key in flight"))
		}
	}
	return dlqTypedError{"gateway_down", "gateway: 503 service unavailable"}
}

// counts returns how many times each id was processed since healing.
func (s *dlqService) counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.processed))
	for k, v := range s.processed {
		out[k] = v
	}
	return out
}

func (s *dlqService) metadata(id string) message.Metadata {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[id]
}

// fill publishes a message for each id and waits until all of them are in the DLQ.
func (s *dlqService) fill(t *testing.T, e *env, ids ...string) {
	t.Helper()
	for _, id := range ids {
		m := message.NewMessage(id, []byte(`{"payment":"`+id+`"}`))
		m.Metadata.Set(headers.TraceParent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		e.publish(t, s.queue, m)
	}
	require.Eventually(t, func() bool {
		return e.count(t, topology.DLQ(s.queue)) == len(ids) && e.count(t, s.queue) == 0
	}, 60*time.Second, 20*time.Millisecond, "%d messages dead-lettered", len(ids))
}

// peekDLQ returns the ids in the DLQ, head first, read with the plain client without
// consuming them, once the DLQ holds want messages.
func peekDLQ(t *testing.T, e *env, queue string, want int) []string {
	t.Helper()
	dlq := topology.DLQ(queue)
	require.Eventually(t, func() bool { return e.count(t, dlq) == want }, 10*time.Second, 10*time.Millisecond,
		"%s holds %d messages", dlq, want)
	var ids []string
	for _, d := range peekQueue(t, e.rabbit, dlq) {
		id, _ := d.Headers["_watermill_message_uuid"].(string)
		ids = append(ids, id)
	}
	require.Eventually(t, func() bool { return e.count(t, dlq) == len(ids) }, 10*time.Second, 10*time.Millisecond)
	return ids
}

// TestDLQCLI runs `sluice dlq` as an operator would, on DLQs filled by a real stack.
func TestDLQCLI(t *testing.T) {
	t.Parallel() // its own queues on the shared node: see the package doc
	c := &dlqCLI{e: rabbitEnv(t), bin: sluiceCLI(t)}
	t.Run("list, show and stats leave the DLQ as it was", c.testReadOnly)
	t.Run("replay moves messages back to the running stack", c.testReplay)
	t.Run("purge needs --yes", c.testPurge)
	t.Run("errors have clear messages and exit codes", c.testErrors)
}

// dlqCLI is what TestDLQCLI's parts share: the broker and the built command.
type dlqCLI struct {
	e   *env
	bin string
}

func (c *dlqCLI) testReadOnly(t *testing.T) {
	e, bin, url := c.e, c.bin, c.e.rabbit.URL
	queue := e.newQueue(t, "test.dlqcli.read")
	svc := startDLQService(t, e, queue)
	svc.fill(t, e, "perm-1", "fail-1", "perm-2", "fail-2", "perm-3")
	before := peekDLQ(t, e, queue, 5)
	require.ElementsMatch(t, []string{"perm-1", "fail-1", "perm-2", "fail-2", "perm-3"}, before)

	cases := []struct {
		name  string
		args  []string
		check func(t *testing.T, out string)
	}{
		{name: "list", args: []string{"dlq", "list", "--queue", queue}, check: checkDLQList(queue, before)},
		{name: "list --json", args: []string{"dlq", "list", "--queue", queue, "--json"}, check: checkDLQListJSON(queue, before)},
		{name: "show", args: []string{"dlq", "show", "--queue", queue, "fail-2"}, check: func(t *testing.T, out string) {
			for _, want := range []string{
				"Message fail-2", "Record:", "error type:", "gateway_down (retryable)", "reason:", "retries_exhausted", "handler:", "dlq-cli",
				"original queue:", "retries:", "history:", "attempt 2", "Properties:", "Headers:",
				"x-error-type:", "x-failed-at:", "traceparent:", "00-4bf92f3577b34da6a3ce929d0e0e4736",
				"Payload (", `{"payment":"fail-2"}`,
			} {
				assert.Contains(t, out, want)
			}
		}},
		{name: "show --json", args: []string{"dlq", "show", "--queue", queue, "--json", "perm-2"}, check: checkDLQShowJSON(queue)},
		{name: "stats", args: []string{"dlq", "stats", "--queue", queue}, check: func(t *testing.T, out string) {
			assert.Contains(t, out, queue+".dlq: 5 messages, oldest ")
			assert.Regexp(t, `(?m)^invalid_amount\s+3\s+\d+s$`, out)
			assert.Regexp(t, `(?m)^gateway_down\s+2\s+\d+s$`, out)
		}},
		{name: "stats --json", args: []string{"dlq", "stats", "--queue", queue, "--json"}, check: checkDLQStatsJSON},
		{name: "replay --dry-run", args: []string{"dlq", "replay", "--queue", queue, "--all", "--dry-run"}, check: func(t *testing.T, out string) {
			assert.Contains(t, out, "dry run: would replay 5 of 5 messages")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := runSluice(t, bin, url, tc.args...)
			require.Equal(t, 0, res.code, res)
			tc.check(t, res.stdout)
			assert.Equal(t, before, peekDLQ(t, e, queue, 5), "same messages in the same order")
		})
	}
}

// checkDLQList checks `dlq list` on the read-only DLQ holding before.
func checkDLQList(queue string, before []string) func(t *testing.T, out string) {
	return func(t *testing.T, out string) {
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.GreaterOrEqual(t, len(lines), 6, out)
		assert.Regexp(t, `^ID\s+AGE\s+ERROR TYPE\s+ERROR\s+RETRIES$`, lines[0])
		for i, id := range before {
			assert.True(t, strings.HasPrefix(lines[i+1], id+" "), "row %d is %s in DLQ order: %q", i+1, id, lines[i+1])
			if strings.HasPrefix(id, "perm-") {
				assert.Regexp(t, `invalid_amount\s+permanent: amount must be positive: `+id+`\s+0$`, lines[i+1])
			} else {
				// The error column is cut to 60 bytes.
				assert.Regexp(t, `gateway_down\s+retries exhausted after 1 retries: gateway: 503 \S+ \S+…\s+1$`, lines[i+1])
			}
		}
		assert.Contains(t, out, "5 messages in "+topology.DLQ(queue))
	}
}

// checkDLQListJSON checks `dlq list --json` on the read-only DLQ holding before.
func checkDLQListJSON(queue string, before []string) func(t *testing.T, out string) {
	return func(t *testing.T, out string) {
		var got struct {
			Queue    string `json:"queue"`
			DLQ      string `json:"dlq"`
			Total    int    `json:"total"`
			Messages []struct {
				ID            string   `json:"id"`
				Position      int      `json:"position"`
				AgeSeconds    *float64 `json:"age_seconds"`
				FailedAt      string   `json:"failed_at"`
				ErrorType     string   `json:"error_type"`
				ErrorClass    string   `json:"error_class"`
				Error         string   `json:"error"`
				Retries       int      `json:"retries"`
				Replays       int      `json:"replays"`
				OriginalQueue string   `json:"original_queue"`
				Handler       string   `json:"handler"`
			} `json:"messages"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &got), out)
		assert.Equal(t, queue, got.Queue)
		assert.Equal(t, topology.DLQ(queue), got.DLQ)
		assert.Equal(t, 5, got.Total)
		require.Len(t, got.Messages, 5)
		for i, m := range got.Messages {
			assert.Equal(t, before[i], m.ID)
			assert.Equal(t, i+1, m.Position)
			require.NotNil(t, m.AgeSeconds, m.ID)
			assert.GreaterOrEqual(t, *m.AgeSeconds, 0.0)
			assert.Less(t, *m.AgeSeconds, 120.0)
			_, err := time.Parse(time.RFC3339Nano, m.FailedAt)
			assert.NoError(t, err, "failed_at of %s", m.ID)
			assert.Equal(t, queue, m.OriginalQueue)
			assert.Equal(t, "dlq-cli", m.Handler)
			assert.Equal(t, 0, m.Replays)
			if strings.HasPrefix(m.ID, "perm-") {
				assert.Equal(t, "invalid_amount", m.ErrorType)
				assert.Equal(t, "permanent", m.ErrorClass)
				assert.Equal(t, 0, m.Retries)
				assert.Contains(t, m.Error, "amount must be positive")
			} else {
				assert.Equal(t, "gateway_down", m.ErrorType)
				assert.Equal(t, "retryable", m.ErrorClass)
				assert.Equal(t, 1, m.Retries)
				assert.Contains(t, m.Error, "503 service unavailable")
			}
		}
	}
}

// checkDLQShowJSON checks `dlq show --json perm-2` on the read-only DLQ.
func checkDLQShowJSON(queue string) func(t *testing.T, out string) {
	return func(t *testing.T, out string) {
		var got struct {
			ID              string            `json:"id"`
			ErrorType       string            `json:"error_type"`
			ErrorMessage    string            `json:"error_message"`
			Headers         map[string]string `json:"headers"`
			Payload         string            `json:"payload"`
			PayloadEncoding string            `json:"payload_encoding"`
			History         []json.RawMessage `json:"history"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &got), out)
		assert.Equal(t, "perm-2", got.ID)
		assert.Equal(t, "invalid_amount", got.ErrorType)
		assert.Equal(t, "permanent: amount must be positive: perm-2", got.ErrorMessage)
		assert.Equal(t, "invalid_amount", got.Headers[sluice.HeaderErrorType])
		assert.Equal(t, queue, got.Headers[sluice.HeaderOriginalQueue])
		assert.Equal(t, `{"payment":"perm-2"}`, got.Payload)
		assert.Equal(t, "utf-8", got.PayloadEncoding)
		assert.Len(t, got.History, 1)
	}
}

// checkDLQStatsJSON checks `dlq stats --json` on the read-only DLQ.
func checkDLQStatsJSON(t *testing.T, out string) {
	var got struct {
		Total       int     `json:"total"`
		OldestAge   float64 `json:"oldest_age_seconds"`
		ByErrorType []struct {
			ErrorType string `json:"error_type"`
			Count     int    `json:"count"`
		} `json:"by_error_type"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.Equal(t, 5, got.Total)
	assert.Greater(t, got.OldestAge, 0.0)
	require.Len(t, got.ByErrorType, 2)
	assert.Equal(t, "invalid_amount", got.ByErrorType[0].ErrorType)
	assert.Equal(t, 3, got.ByErrorType[0].Count)
	assert.Equal(t, "gateway_down", got.ByErrorType[1].ErrorType)
	assert.Equal(t, 2, got.ByErrorType[1].Count)
}

func (c *dlqCLI) testReplay(t *testing.T) {
	e, bin, url := c.e, c.bin, c.e.rabbit.URL
	queue := e.newQueue(t, "test.dlqcli.replay")
	svc := startDLQService(t, e, queue)
	svc.fill(t, e, "perm-1", "perm-2", "fail-1", "fail-2", "perm-3", "fail-3")
	svc.healed.Store(true)

	steps := []struct {
		name      string
		args      []string
		wantOut   string
		processed []string // all ids processed so far
		dlqLeft   int
	}{
		{name: "one id", args: []string{"--id", "perm-2"}, wantOut: "replayed 1 of 6 messages read from " + queue + ".dlq: perm-2",
			processed: []string{"perm-2"}, dlqLeft: 5},
		{name: "an error type and a reason", args: []string{"--error-type", "gateway_down", "--reason", "retries_exhausted"}, wantOut: "replayed 3 of 5 messages",
			processed: []string{"perm-2", "fail-1", "fail-2", "fail-3"}, dlqLeft: 2},
		{name: "all", args: []string{"--all"}, wantOut: "replayed 2 of 2 messages",
			processed: []string{"perm-2", "fail-1", "fail-2", "fail-3", "perm-1", "perm-3"}, dlqLeft: 0},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			res := runSluice(t, bin, url, append([]string{"dlq", "replay", "--queue", queue}, st.args...)...)
			require.Equal(t, 0, res.code, res)
			assert.Contains(t, res.stdout, st.wantOut)
			require.Eventually(t, func() bool { return len(svc.counts()) == len(st.processed) }, 30*time.Second, 20*time.Millisecond,
				"processed %v", st.processed)
			assert.Equal(t, st.dlqLeft, e.count(t, topology.DLQ(queue)), "DLQ count")
			counts := svc.counts()
			for _, id := range st.processed {
				assert.Equal(t, 1, counts[id], "%s processed once", id)
				md := svc.metadata(id)
				assert.Equal(t, "1", md.Get(headers.ReplayCount), "%s x-replay-count", id)
				assert.Empty(t, md.Get(sluice.HeaderRetryCount), "%s retry count reset", id)
				assert.Empty(t, md.Get(sluice.HeaderErrorType), "%s failure record removed", id)
				assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", md.Get(headers.TraceParent), "%s trace kept", id)
			}
		})
	}
	time.Sleep(500 * time.Millisecond) // anything processed twice would show now
	for id, n := range svc.counts() {
		assert.Equal(t, 1, n, "%s processed once", id)
	}
}

func (c *dlqCLI) testPurge(t *testing.T) {
	e, bin, url := c.e, c.bin, c.e.rabbit.URL
	queue := e.newQueue(t, "test.dlqcli.purge")
	svc := startDLQService(t, e, queue)
	svc.fill(t, e, "perm-1", "perm-2")
	steps := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
		wantErr  string
		dlqLeft  int
	}{
		{name: "without --yes", args: []string{"dlq", "purge", "--queue", queue}, wantCode: 2, wantErr: "refusing to purge " + queue + ".dlq without --yes", dlqLeft: 2},
		{name: "with --yes", args: []string{"dlq", "purge", "--queue", queue, "--yes"}, wantCode: 0, wantOut: "purged 2 of 2 messages read from " + topology.DLQ(queue), dlqLeft: 0},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			res := runSluice(t, bin, url, st.args...)
			require.Equal(t, st.wantCode, res.code, res)
			assert.Contains(t, res.stdout, st.wantOut)
			assert.Contains(t, res.stderr, st.wantErr)
			assert.Equal(t, st.dlqLeft, e.count(t, topology.DLQ(queue)))
		})
	}
}

func (c *dlqCLI) testErrors(t *testing.T) {
	e, bin, url := c.e, c.bin, c.e.rabbit.URL
	queue := e.newQueue(t, "test.dlqcli.errors")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	require.NoError(t, e.amqp.DeclareQueue(ctx, queue)) // an empty DLQ
	const secret = "Sup3rS3cret"
	unreachable := "amqp://operator:" + secret + "@127.0.0.1:1/"
	cases := []struct {
		name     string
		url      string
		args     []string
		wantCode int
		wantErr  string
	}{
		{name: "unreachable broker: list", url: unreachable, args: []string{"dlq", "list", "--queue", queue}, wantCode: 1,
			wantErr: "connect to RabbitMQ at amqp://operator:xxxxx@127.0.0.1:1/"},
		{name: "unreachable broker: replay", url: unreachable, args: []string{"dlq", "replay", "--queue", queue, "--all"}, wantCode: 1,
			wantErr: "amqp://operator:xxxxx@127.0.0.1:1/"},
		{name: "unreachable broker: purge", url: unreachable, args: []string{"dlq", "purge", "--queue", queue, "--yes"}, wantCode: 1,
			wantErr: "amqp://operator:xxxxx@127.0.0.1:1/"},
		{name: "missing queue: list", url: url, args: []string{"dlq", "list", "--queue", "no.such.queue.dlqcli"}, wantCode: 3,
			wantErr: `dead-letter queue "no.such.queue.dlqcli.dlq" of queue "no.such.queue.dlqcli": queue not found`},
		{name: "missing queue: stats", url: url, args: []string{"dlq", "stats", "--queue", "no.such.queue.dlqcli"}, wantCode: 3, wantErr: "queue not found"},
		{name: "missing queue: replay", url: url, args: []string{"dlq", "replay", "--queue", "no.such.queue.dlqcli", "--all"}, wantCode: 3, wantErr: "queue not found"},
		{name: "unknown id: show", url: url, args: []string{"dlq", "show", "--queue", queue, "nope"}, wantCode: 3,
			wantErr: `message "nope" in "` + queue + `.dlq": message not found`},
		{name: "unknown id: replay", url: url, args: []string{"dlq", "replay", "--queue", queue, "--id", "nope"}, wantCode: 3, wantErr: "message not found"},
		{name: "usage: no --queue", url: url, args: []string{"dlq", "list"}, wantCode: 2, wantErr: "--queue is required"},
		{name: "usage: replay without a selector", url: url, args: []string{"dlq", "replay", "--queue", queue}, wantCode: 2, wantErr: "one selector is required"},
		{name: "usage: show without an id", url: url, args: []string{"dlq", "show", "--queue", queue}, wantCode: 2, wantErr: "want exactly one message ID"},
		{name: "usage: unknown command", url: url, args: []string{"dlq", "drain"}, wantCode: 2, wantErr: `unknown command "drain"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := runSluice(t, bin, tc.url, tc.args...)
			assert.Equal(t, tc.wantCode, res.code, res)
			assert.Contains(t, res.stderr, tc.wantErr)
			assert.NotContains(t, res.stdout+res.stderr, secret, "the password is never printed")
		})
	}
}

// Issue 17: a panic's whole stack was in the DLQ list row (and every record field), and an
// untyped error was listed as "error". The row names the panic by its value and a wrapped
// *net.OpError by its Go type.
func TestDLQCLIListRowsNameTheFailure(t *testing.T) {
	e := rabbitEnv(t)
	queue := e.newQueue(t, "test.dlqcli.rows")
	cfg := router.Config{Retry: retry.Config{MaxRetries: -1}}
	start(t, e, cfg, func(st *router.Stack) {
		require.NoError(t, st.Handle("rows", queue, func(m *message.Message) error {
			if m.UUID == "boom-1" {
				panic("card store is nil")
			}
			return fmt.Errorf("charge %s: %w", m.UUID, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")})
		}))
	})
	e.publish(t, queue, message.NewMessage("boom-1", []byte(`{}`)))
	require.Eventually(t, func() bool { return e.count(t, topology.DLQ(queue)) == 1 }, 30*time.Second, 20*time.Millisecond)
	e.publish(t, queue, message.NewMessage("net-1", []byte(`{}`)))
	require.Eventually(t, func() bool { return e.count(t, topology.DLQ(queue)) == 2 }, 30*time.Second, 20*time.Millisecond)

	res := runSluice(t, sluiceCLI(t), e.rabbit.URL, "dlq", "list", "--queue", queue)
	require.Equal(t, 0, res.code, res.String())
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	require.GreaterOrEqual(t, len(lines), 3, res.stdout)
	assert.Regexp(t, `^boom-1\s+\S+\s+panic\s+retries exhausted after 0 retries: panic: card store is nil\s+0$`, lines[1])
	assert.Regexp(t, `^net-1\s+\S+\s+net\.OpError\s+retries exhausted after 0 retries: charge net-1: .*…\s+0$`, lines[2])

	show := runSluice(t, sluiceCLI(t), e.rabbit.URL, "dlq", "show", "--queue", queue, "boom-1")
	require.Equal(t, 0, show.code, show.String())
	// The stack is the record's stack (and its x-error-stack header); the message fields
	// and the history name the panic by its value.
	assert.Contains(t, show.stdout, "goroutine ")
	checked := 0
	for _, line := range strings.Split(show.stdout, "\n") {
		field, _, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch field {
		case "error", sluice.HeaderErrorMessage, sluice.HeaderLastErrorMessage, sluice.HeaderRetryHistory:
			checked++
			assert.Contains(t, line, "panic: card store is nil")
			assert.NotContains(t, line, "goroutine", "%s holds no stack", field)
		}
	}
	assert.Equal(t, 4, checked, show.stdout)
}
