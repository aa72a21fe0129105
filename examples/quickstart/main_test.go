package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// readmeMarker precedes, in docs/getting-started.md, the code block that must be this program.
const readmeMarker = "<!-- examples/quickstart/main.go -->"

// Issue 17: the README's first example registered WithIdempotencyKey without
// Config.Idempotency, so a duplicate was handled three times. The example is this program:
// docs/getting-started.md shows it byte for byte after readmeMarker, and README.md shows an
// excerpt of it (issue 38: the whole program would fill most of a short README), whose
// lines must be this program's, in order.
func TestREADMEShowsThisProgram(t *testing.T) {
	root := testenv.ModuleRoot(t)
	program, err := os.ReadFile("main.go")
	require.NoError(t, err)
	// block returns the ```go block that follows marker in the page.
	block := func(t *testing.T, page, marker string) string {
		t.Helper()
		text, err := os.ReadFile(filepath.Join(root, page))
		require.NoError(t, err)
		_, after, found := strings.Cut(string(text), marker)
		require.True(t, found, "%s has no %q before the example", page, marker)
		after = strings.TrimLeft(after, "\n")
		require.True(t, strings.HasPrefix(after, "```go\n"), "the marker is followed by a ```go block")
		code, _, found := strings.Cut(strings.TrimPrefix(after, "```go\n"), "\n```\n")
		require.True(t, found, "%s's example block is not closed", page)
		return code + "\n"
	}

	t.Run("docs/getting-started.md shows the whole program", func(t *testing.T) {
		assert.Equal(t, string(program), block(t, "docs/getting-started.md", readmeMarker),
			"docs/getting-started.md's example differs from examples/quickstart/main.go: copy the file into the block")
	})
	t.Run("README.md shows lines of it, in order", func(t *testing.T) {
		excerpt := block(t, "README.md", "<!-- excerpt of examples/quickstart/main.go -->")
		lines := strings.Split(string(program), "\n")
		at, shown := 0, 0
		for _, want := range strings.Split(excerpt, "\n") {
			if strings.TrimSpace(want) == "" || strings.TrimSpace(want) == "// ..." {
				continue // "// ..." stands for lines left out
			}
			for at < len(lines) && lines[at] != want {
				at++
			}
			require.Less(t, at, len(lines), "README.md's excerpt line %q is not in examples/quickstart/main.go after the lines before it: change both together", want)
			at++
			shown++
		}
		assert.Greater(t, shown, 10, "the README shows the handler's registration and the handler")
	})
}

// The example consumes from RabbitMQ: a payment is charged once however often it is sent,
// and a body that does not decode is dead-lettered as a decode failure.
func TestRunAgainstRabbitMQ(t *testing.T) {
	r := testenv.NewRabbit(t)
	t.Setenv("AMQP_URL", r.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "") // spans are made, not exported
	queue, output := testenv.Name("quickstart.requested"), testenv.Name("quickstart.succeeded")
	r.DeleteQueues(queue, topology.DLQ(queue), output, topology.DLQ(output))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, "", testenv.Name("quickstart.orders"), queue, output) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("run did not return after its context ended")
		}
	})
	require.Eventually(t, func() bool { return r.Count(queue) >= 0 && r.Count(output) >= 0 }, 30*time.Second, 50*time.Millisecond, "queues declared")

	publish := func(id, body string) {
		r.Publish(queue, amqp091.Publishing{MessageId: id, DeliveryMode: amqp091.Persistent, Body: []byte(body)})
	}
	publish("m-1", `{"payment_id":"pay_1","amount_cents":1299}`)
	publish("m-2", `{"payment_id":"pay_1","amount_cents":1299}`) // the same payment again
	publish("m-3", `{"payment_id":`)

	require.Eventually(t, func() bool { return r.Count(topology.DLQ(queue)) == 1 && r.Count(output) >= 1 }, 30*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { return r.Count(queue) == 0 }, 10*time.Second, 50*time.Millisecond, "every request handled")
	time.Sleep(500 * time.Millisecond) // a second event for the duplicate would show now
	assert.Equal(t, 1, r.Count(output), "pay_1 charged once")

	ev, ok := r.Get(output)
	require.True(t, ok)
	var event map[string]string
	require.NoError(t, json.Unmarshal(ev.Body, &event))
	assert.Equal(t, map[string]string{"payment_id": "pay_1", "status": "succeeded"}, event)

	dead, ok := r.Get(topology.DLQ(queue))
	require.True(t, ok)
	assert.Equal(t, "m-3", dead.MessageId)
	assert.Equal(t, "json.SyntaxError", dead.Headers[sluice.HeaderErrorType])
	assert.Equal(t, "permanent", dead.Headers[headers.ErrorClass])
	// The key function fails first: the idempotency step dead-letters the request as bad input.
	assert.Contains(t, dead.Headers[sluice.HeaderErrorMessage], "permanent: unexpected end of JSON input (no idempotency key for message m-3)")
}

// deployMetric is a metric (or label) name in a PromQL expression of deploy/.
var deployMetric = regexp.MustCompile(`\b(?:sluice|messaging)_[a-z_]+\b`)

// deployNames returns every sluice_* and messaging_* name the alert rules and the
// dashboard's panels use, each with the file naming it.
func deployNames(t *testing.T) map[string]string {
	t.Helper()
	root := testenv.ModuleRoot(t)
	names := map[string]string{}
	for _, f := range []string{"deploy/prometheus/alerts.yml", "deploy/grafana/sluice.json"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		require.NoError(t, err)
		for _, n := range deployMetric.FindAllString(string(b), -1) {
			names[n] = f
		}
	}
	require.Contains(t, names, "sluice_queue_depth", "the deploy files were read")
	return names
}

// Issue 35: a service built as the README shows had no sluice_queue_depth,
// sluice_queue_consumers or sluice_connection_up, so 4 of the 8 shipped alerts and the
// dashboard's DLQ panels stayed empty. The quickstart, run as the README runs it with
// METRICS_ADDR, serves every name an alert rule or a dashboard panel uses, once it has
// seen the events they count (a payment, a duplicate, a malformed request, a rate-limited
// one that is retried).
func TestQuickstartServesWhatTheDashboardAndAlertsRead(t *testing.T) {
	r := testenv.NewRabbit(t)
	t.Setenv("AMQP_URL", r.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	queue, output := testenv.Name("quickstart.ops.requested"), testenv.Name("quickstart.ops.succeeded")
	r.DeleteQueues(queue, topology.DLQ(queue), output, topology.DLQ(output))
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, addr, testenv.Name("quickstart.ops.orders"), queue, output) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("run did not return after its context ended")
		}
	})
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	require.Eventually(t, func() bool { return r.Count(queue) >= 0 }, 30*time.Second, 50*time.Millisecond, "queues declared")
	require.Eventually(t, func() bool { code, _ := get("/readyz"); return code == http.StatusOK }, 30*time.Second, 50*time.Millisecond,
		"/readyz says ready once the stack consumes")

	publish := func(id, body string) {
		r.Publish(queue, amqp091.Publishing{MessageId: id, DeliveryMode: amqp091.Persistent, Body: []byte(body)})
	}
	publish("m-1", `{"payment_id":"pay_1","amount_cents":1299}`)
	publish("m-2", `{"payment_id":"pay_1","amount_cents":1299}`)    // a duplicate
	publish("m-3", `{"payment_id":`)                                // dead-lettered
	publish("m-4", `{"payment_id":"pay_2","amount_cents":2000000}`) // rate limited: retried

	names := deployNames(t)
	var missing []string
	ok := assert.Eventually(t, func() bool {
		_, scrape := get("/metrics")
		missing = missing[:0]
		for name := range names {
			// A name in a PromQL expression is a metric or one of its labels.
			if !strings.Contains(scrape, "\n"+name+"{") && !strings.Contains(scrape, "\n"+name+" ") && !strings.Contains(scrape, ","+name+`="`) && !strings.Contains(scrape, "{"+name+`="`) {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0
	}, 30*time.Second, 200*time.Millisecond)
	if !ok {
		_, scrape := get("/metrics")
		t.Logf("queue %d dlq %d output %d\n%s", r.Count(queue), r.Count(topology.DLQ(queue)), r.Count(output), scrape)
		slices.Sort(missing)
		for _, m := range missing {
			t.Errorf("%s (used in %s) is not in the quickstart's scrape", m, names[m])
		}
	}
	_, scrape := get("/metrics")
	assert.Contains(t, scrape, `sluice_queue_depth{kind="dlq",`, "the DLQ panels' series")
	assert.Regexp(t, `sluice_connection_up\{[^}]*\} 1\n`, scrape)
}
