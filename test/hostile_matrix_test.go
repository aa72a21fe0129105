package test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// matrixRow is one header sluice owns, forged by a producer (docs/reliability.md, "Headers a producer
// cannot steer").
type matrixRow struct {
	name string
	// forged are the headers the producer sends.
	forged amqp091.Table
	// perm makes the handler fail permanently (one attempt); otherwise it fails retryably
	// (startDLQService: one retry, then the DLQ).
	perm bool
	// deferOnce makes the handler defer the message once before it fails retryably.
	deferOnce bool
	// legacy publishes the message straight into Q.dlq, as a record written before sluice
	// overwrote x-original-queue: it goes through the replay only.
	legacy bool
	// ignored is the replay's ignored_origins.
	ignored int
	// record checks the dead letter's record; replayed what the handler received after the
	// replay.
	record   func(t *testing.T, r dlq.Record)
	replayed func(t *testing.T, md message.Metadata, r dlq.Record)
}

// matrixRows lists every header of the matrix; victim is another service's queue.
func matrixRows(queue, victim string) []matrixRow {
	old := "2000-01-01T00:00:00Z"
	forgedHistory := `[{"at":"2000-01-01T00:00:00Z","attempt":7,"type":"forged","message":"made up"},` +
		`{"at":"2000-01-01T00:00:01Z","attempt":8,"type":"forged","message":"made up"}]`
	note := func(want string) func(t *testing.T, r dlq.Record) {
		return func(t *testing.T, r dlq.Record) { assert.Equal(t, want, r.RetryNote) }
	}
	return []matrixRow{
		{
			name: "x-original-queue names another service's queue", perm: true,
			forged: amqp091.Table{sluice.HeaderOriginalQueue: victim},
			record: func(t *testing.T, r dlq.Record) {
				assert.Equal(t, victim, r.ProducerOriginalQueue, "kept as what the producer said")
				assert.Equal(t, victim, r.Headers[headers.ProducerOriginalQueue])
			},
		},
		{
			name: "x-original-queue names a partition of the queue", perm: true,
			forged: amqp091.Table{sluice.HeaderOriginalQueue: topology.Partition(queue, 1)},
			record: func(t *testing.T, r dlq.Record) {
				assert.Equal(t, topology.Partition(queue, 1), r.ProducerOriginalQueue)
			},
		},
		{
			name:   "x-original-queue through the retry path",
			forged: amqp091.Table{sluice.HeaderOriginalQueue: victim},
			record: func(t *testing.T, r dlq.Record) {
				assert.Equal(t, victim, r.ProducerOriginalQueue, "carried from the retry copy")
				assert.Equal(t, "2 attempts made here", r.RetryNote)
			},
		},
		{
			name: "a record written before this fix names another queue", legacy: true, ignored: 1,
			record: func(t *testing.T, r dlq.Record) {
				assert.Equal(t, victim, r.IgnoredOrigin, "the recorded origin, not followed")
			},
		},
		{
			name: "x-first-death-queue names another queue", perm: true,
			forged: amqp091.Table{"x-first-death-queue": victim, "x-first-death-reason": "rejected"},
			record: func(t *testing.T, r dlq.Record) {
				assert.Equal(t, "invalid_amount", r.ErrorType, "sluice's record wins over RabbitMQ-looking headers")
			},
		},
		{
			name:   "x-retry-count 99",
			forged: amqp091.Table{sluice.HeaderRetryCount: "99"},
			record: func(t *testing.T, r dlq.Record) {
				assert.Equal(t, 99, r.Retries)
				assert.Equal(t, "arrived with x-retry-count 99; 1 attempt made here", r.RetryNote)
				assert.Contains(t, r.ErrorMessage, "arrived with x-retry-count 99; 1 attempt made here")
				assert.NotContains(t, r.ErrorMessage, "after 99 retries")
			},
		},
		{
			name:   "x-retry-count beyond the clamp",
			forged: amqp091.Table{sluice.HeaderRetryCount: "1000000000000"},
			record: note("arrived with x-retry-count 1000000; 1 attempt made here"),
		},
		{
			name:   "x-retry-count negative",
			forged: amqp091.Table{sluice.HeaderRetryCount: "-5"},
			record: func(t *testing.T, r dlq.Record) {
				assert.Equal(t, 1, r.Retries, "read as 0: the message had its retry")
				assert.Equal(t, "2 attempts made here", r.RetryNote)
			},
		},
		{
			// RabbitMQ's own count of a quorum queue's redeliveries, which the native retry
			// adds to x-retry-count: a producer's value on a first delivery counts nothing.
			name:   "x-delivery-count 99",
			forged: amqp091.Table{"x-delivery-count": int64(99)},
			record: func(t *testing.T, r dlq.Record) {
				assert.Equal(t, 1, r.Retries, "the message had its one retry")
				assert.Equal(t, "2 attempts made here", r.RetryNote)
				// Not "99": the message's queue name is random digits.
				assert.NotContains(t, r.ErrorMessage, "arrived with", "no count arrived with the message")
				assert.NotEqual(t, "99", r.Headers["x-delivery-count"], "never written back by sluice")
			},
		},
		{
			name:   "x-trip-attempts and x-arrived-retry-count that disagree with the count",
			forged: amqp091.Table{headers.TripAttempts: "50", headers.ArrivedRetryCount: "7"},
			record: note("2 attempts made here"),
		},
		{
			name:   "x-retry-history",
			forged: amqp091.Table{sluice.HeaderRetryHistory: forgedHistory},
			record: func(t *testing.T, r dlq.Record) {
				require.Len(t, r.History, 2)
				for i, e := range r.History {
					assert.Equal(t, i+1, e.Attempt, "sluice's own attempts only")
					assert.Equal(t, "gateway_down", e.Type)
				}
				assert.Contains(t, r.Headers[headers.ProducerRetryHistory], "made up", "kept as what the producer said")
			},
		},
		{
			name:   "x-first-failure-time in the distant past",
			forged: amqp091.Table{headers.FirstFailureTime: old},
			record: func(t *testing.T, r dlq.Record) {
				assert.Equal(t, 1, r.Retries, "the producer's time does not age the message")
				assert.WithinDuration(t, time.Now(), r.FirstFailureAt, 2*time.Minute)
				assert.Equal(t, old, r.Headers[headers.ProducerFirstFailureTime])
			},
		},
		{
			name:      "x-defer-count beyond the clamp and x-first-defer-time in the future",
			deferOnce: true,
			forged:    amqp091.Table{headers.DeferCount: "1000000000000", headers.FirstDeferTime: "2999-01-01T00:00:00Z"},
			record: func(t *testing.T, r dlq.Record) {
				assert.Equal(t, strconv.Itoa(sluice.MaxRetryCountHeader+1), r.Headers[headers.DeferCount], "clamped, then counted")
				at, err := time.Parse(time.RFC3339Nano, r.Headers[headers.FirstDeferTime])
				require.NoError(t, err)
				assert.WithinDuration(t, time.Now(), at, 2*time.Minute, "a future first-defer time is replaced by the deferral's")
				assert.Equal(t, 1, r.Retries, "deferred without using an attempt, then its one retry")
				assert.Equal(t, "gateway_down", r.ErrorType)
			},
		},
		{
			name:      "x-first-defer-time in the distant past",
			deferOnce: true,
			forged:    amqp091.Table{headers.FirstDeferTime: old},
			record: func(t *testing.T, r dlq.Record) {
				// Documented: a producer's past time can only shorten deferrals, never lengthen them.
				assert.Contains(t, r.ErrorMessage, "deferred past the maximum total age")
				assert.Equal(t, 0, r.Retries, "dead-lettered at the deferral, no attempt used")
				assert.Empty(t, r.Headers[headers.DeferCount], "no deferral copy was made")
			},
		},
		{
			name: "x-last-failure-time, x-last-error and x-last-error-message",
			forged: amqp091.Table{headers.LastFailureTime: old, sluice.HeaderLastError: "forged",
				sluice.HeaderLastErrorMessage: "forged"},
			record: func(t *testing.T, r dlq.Record) {
				assert.NotEqual(t, old, r.Headers[headers.LastFailureTime])
				assert.Equal(t, "gateway_down", r.Headers[sluice.HeaderLastError])
				assert.Contains(t, r.Headers[sluice.HeaderLastErrorMessage], "503")
			},
		},
		{
			name: "x-error-type, x-error-class, x-dead-letter-reason, x-error-message and x-error-stack",
			forged: amqp091.Table{sluice.HeaderErrorType: "forged", headers.ErrorClass: "discard",
				headers.DeadLetterReason:  "retry_unlikely",
				sluice.HeaderErrorMessage: "forged", sluice.HeaderErrorStack: "goroutine 1 [forged]"},
			record: func(t *testing.T, r dlq.Record) {
				assert.Equal(t, "gateway_down", r.ErrorType)
				assert.Equal(t, "retryable", r.ErrorClass)
				assert.Equal(t, "retries_exhausted", r.Reason)
				assert.Contains(t, r.ErrorMessage, "503")
				assert.Empty(t, r.ErrorStack, "no panic, no stack")
			},
		},
		{
			// A forged compensation would make replay ask for --compensated for an event
			// no handler sent.
			name: "x-compensation-id, x-compensation-to and x-compensation-error", perm: true,
			forged: amqp091.Table{headers.CompensationID: "forged-event", headers.CompensationTo: "queue billing",
				headers.CompensationError: "forged"},
			record: func(t *testing.T, r dlq.Record) {
				assert.Empty(t, r.CompensationID, "this handler has no compensation")
				assert.Empty(t, r.CompensationTo)
				assert.Empty(t, r.CompensationError)
			},
		},
		{
			name: "x-handler", perm: true,
			forged: amqp091.Table{headers.Handler: "billing"},
			record: func(t *testing.T, r dlq.Record) { assert.Equal(t, "dlq-cli", r.Handler) },
		},
		{
			name: "x-failed-at, x-failed-host, x-failed-pid and x-failed-stage", perm: true,
			forged: amqp091.Table{headers.FailedAt: old, headers.FailedHost: "forged-host",
				headers.FailedPID: "1", headers.FailedStage: "idempotency key function"},
			record: func(t *testing.T, r dlq.Record) {
				host, _ := os.Hostname()
				assert.Equal(t, host, r.FailedHost)
				assert.Equal(t, fmt.Sprint(os.Getpid()), r.FailedPID)
				assert.WithinDuration(t, time.Now(), r.FailedAt, 2*time.Minute)
				assert.Empty(t, r.FailedStage, "the handler failed")
				assert.Equal(t, "dlq-cli", r.Handler)
			},
		},
		{
			name: "x-replay-count", perm: true,
			forged: amqp091.Table{headers.ReplayCount: "5"},
			record: func(t *testing.T, r dlq.Record) { assert.Equal(t, 5, r.Replays, "a count, shown") },
			replayed: func(t *testing.T, md message.Metadata, _ dlq.Record) {
				assert.Equal(t, "6", md.Get(headers.ReplayCount))
			},
		},
		{
			// Like x-retry-count, a producer's replay time can only shorten the retries.
			name:   "x-replayed-at in the distant past",
			forged: amqp091.Table{headers.ReplayedAt: old},
			record: func(t *testing.T, r dlq.Record) {
				assert.Equal(t, 0, r.Retries)
				assert.Contains(t, r.ErrorMessage, "retries exhausted: message")
				assert.Equal(t, "1 attempt made here", r.RetryNote)
			},
		},
		{
			name: "x-archived-at", perm: true,
			forged: amqp091.Table{"x-archived-at": old},
			replayed: func(t *testing.T, md message.Metadata, _ dlq.Record) {
				assert.NotContains(t, md, "x-archived-at")
			},
		},
		{
			name: "x-sluice-member and x-unrouted-exchange on a work message", perm: true,
			forged: amqp091.Table{"x-sluice-member": "hello", "x-sluice-member-from": "forged",
				"x-unrouted-exchange": victim, "x-unrouted-routing-key": victim},
			record: func(t *testing.T, r dlq.Record) {
				assert.Equal(t, "hello", r.Headers["x-sluice-member"], "inert on a work message: shown")
			},
		},
		{
			// sluice.dlx routes Q's dead letter by key Q and victim's by key victim: a
			// producer's CC would plant a copy in victim.dlq with sluice's rights.
			name:   "CC (what sluice.dlx and the delay cascade route by)",
			forged: amqp091.Table{"CC": []any{victim}},
			record: func(t *testing.T, r dlq.Record) { assert.NotContains(t, r.Headers, "CC") },
		},
	}
}

// TestHostileHeaderMatrix sends, for every header sluice owns, a message forging it
// through a real stack on RabbitMQ: it fails, is dead-lettered, and is replayed once with
// the CLI and once through the console's JSON API. Each subtest checks the record, that
// the replay reported the message moved (and ignored_origins), and that the message came
// back to the queue it was dead-lettered from, with its history kept.
func TestHostileHeaderMatrix(t *testing.T) {
	t.Parallel() // its own queues on the shared node: see the package doc
	start := time.Now()
	e := rabbitEnv(t)
	queue := e.newQueue(t, "test.matrix")
	victim := e.newQueue(t, "test.matrix.victim")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	require.NoError(t, e.amqp.DeclareQueue(ctx, victim), "another service's queue, with its DLQ")
	svc := startDLQService(t, e, queue)
	rows := matrixRows(queue, victim)
	routes := []string{"cli", "console"}

	type sent struct {
		row   matrixRow
		route string
		id    string
	}
	var all []sent
	for i, row := range rows {
		for _, route := range routes {
			id := fmt.Sprintf("m%02d-%s", i, route)
			switch {
			case row.perm:
				id = "perm-" + id
			case row.deferOnce:
				id = "defer-" + id
			}
			all = append(all, sent{row: row, route: route, id: id})
			body := []byte(`{"payment":"` + id + `"}`)
			if row.legacy {
				e.rabbit.Publish(topology.DLQ(queue), amqp091.Publishing{MessageId: id, Body: body, Headers: amqp091.Table{
					headers.UUID: id, sluice.HeaderOriginalQueue: victim, sluice.HeaderErrorType: "gateway_down",
					sluice.HeaderErrorMessage: "recorded by an older sluice", headers.FailedAt: failure.FormatTime(time.Now()),
				}})
				continue
			}
			hdrs := amqp091.Table{headers.UUID: id}
			for k, v := range row.forged {
				hdrs[k] = v
			}
			e.rabbit.Publish(queue, amqp091.Publishing{MessageId: id, Body: body, Headers: hdrs})
		}
	}
	dlqName := topology.DLQ(queue)
	require.Eventually(t, func() bool {
		return e.count(t, dlqName) == len(all) && e.count(t, queue) == 0
	}, 90*time.Second, 20*time.Millisecond, "%d messages dead-lettered", len(all))

	conn, err := amqp091.Dial(e.rabbit.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	records := map[string]dlq.Record{}
	for _, s := range all {
		recs, err := dlq.Inspector{Conn: conn}.Show(ctx, queue, s.id)
		require.NoError(t, err, s.id)
		records[s.id] = recs[0]
	}

	svc.healed.Store(true)
	bin := sluiceCLI(t)
	console := startConsole(t, bin, e.rabbit.URL, queue)
	type replayOut struct {
		Moved          int `json:"moved"`
		IgnoredOrigins int `json:"ignored_origins"`
	}
	results := map[string]replayOut{}
	for _, s := range all {
		var out replayOut
		switch s.route {
		case "cli":
			run := runSluice(t, bin, e.rabbit.URL, "dlq", "replay", "--queue", queue, "--id", s.id, "--json")
			require.Equal(t, 0, run.code, "%s", run)
			require.NoError(t, json.Unmarshal([]byte(run.stdout), &out), run.stdout)
		case "console":
			require.NoError(t, json.Unmarshal(console.replay(t, s.id), &out))
		}
		results[s.id] = out
	}
	require.Eventually(t, func() bool { return len(svc.counts()) == len(all) }, 60*time.Second, 20*time.Millisecond,
		"every replayed message handled from %s", queue)

	for _, s := range all {
		t.Run(s.row.name+"/"+s.route, func(t *testing.T) {
			rec := records[s.id]
			assert.Equal(t, queue, rec.OriginalQueue, "the record sends a replay to the queue the message failed in")
			if !s.row.legacy {
				assert.Equal(t, queue, rec.Headers[sluice.HeaderOriginalQueue], "x-original-queue is the queue consumed from")
				assert.Empty(t, rec.IgnoredOrigin)
			}
			if s.row.record != nil {
				s.row.record(t, rec)
			}
			assert.Equal(t, replayOut{Moved: 1, IgnoredOrigins: s.row.ignored}, results[s.id], "the replay's result")
			assert.Equal(t, 1, svc.counts()[s.id], "handled once, from %s", queue)
			md := svc.metadata(s.id)
			require.NotNil(t, md)
			assert.Equal(t, queue, md.Get(sluice.HeaderOriginalQueue))
			assert.NotEmpty(t, md.Get(headers.ReplayedAt))
			assert.NotContains(t, md, sluice.HeaderRetryCount, "the replay starts the retries over")
			assert.NotContains(t, md, headers.TripAttempts)
			if !s.row.legacy {
				assert.Equal(t, rec.Headers[headers.FirstFailureTime], md.Get(headers.FirstFailureTime), "the first failure survives the replay")
				history := failure.History(md)
				if assert.Len(t, history, len(rec.History)+1, "the record's history and the replay") {
					assert.Equal(t, "replay", history[len(history)-1].Type)
					assert.Equal(t, "replayed from "+dlqName+" to "+queue, history[len(history)-1].Message)
				}
			}
			if s.row.replayed != nil {
				s.row.replayed(t, md, rec)
			}
		})
	}
	t.Run("nothing reached another service's queue", func(t *testing.T) {
		assert.Zero(t, e.count(t, topology.DLQ(victim)), "no dead letter planted by CC through sluice.dlx")
		// The CC row's producer publish itself routes a copy to victim by the default
		// exchange (its own right); nothing else may.
		assert.Equal(t, 2, e.count(t, victim), "only the producer's own CC copies")
		assert.Zero(t, e.count(t, dlqName), "every message replayed")
	})
	t.Logf("matrix: %d rows, %d messages, %d subtests, %s", len(rows), len(all), len(all)+1, time.Since(start).Round(time.Second))
}

// consoleProc is a running `sluice console`.
type consoleProc struct {
	base, queue, csrf string
}

// startConsole runs `sluice console` on a free loopback port until the test ends.
func startConsole(t *testing.T, bin, amqpURL, queue string) *consoleProc {
	t.Helper()
	cmd := exec.Command(bin, "console", "--addr", "127.0.0.1:0", "--queue", queue)
	cmd.Env = append(os.Environ(), "AMQP_URL="+amqpURL, "JAEGER_QUERY_URL=off", "RABBITMQ_MANAGEMENT_URL=")
	var stderr testenv.SyncBuffer // written by the copying goroutine while the test reads it
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "console: %s", stderr.String())
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	m := regexp.MustCompile(`http://(\S+)/`).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	c := &consoleProc{base: "http://" + m[1], queue: queue}
	resp, err := http.Get(c.base + "/api/v1/csrf")
	require.NoError(t, err)
	defer resp.Body.Close()
	var tok struct {
		Token string `json:"token"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&tok))
	c.csrf = tok.Token
	return c
}

// replay replays message id through POST /api/v1/queues/Q/replay and returns the body.
func (c *consoleProc) replay(t *testing.T, id string) []byte {
	t.Helper()
	body := strings.NewReader(`{"ids":[` + fmt.Sprintf("%q", id) + `]}`)
	req, err := http.NewRequest(http.MethodPost, c.base+"/api/v1/queues/"+c.queue+"/replay", body)
	require.NoError(t, err)
	req.Header.Set("X-CSRF-Token", c.csrf)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	return b
}
