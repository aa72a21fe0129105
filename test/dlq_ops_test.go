package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/dlqfill"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// peekQueue returns the messages of queue, head first, without consuming them: a consumer
// takes them all and closing its channel gives them back in place.
func peekQueue(t *testing.T, r *testenv.Rabbit, queue string) []amqp091.Delivery {
	t.Helper()
	n := r.Count(queue)
	ch, err := r.Conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Qos(min(n+1, 65535), 0, false))
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	require.NoError(t, err)
	var out []amqp091.Delivery
	for len(out) < n {
		select {
		case d := <-ds:
			out = append(out, d)
		case <-time.After(10 * time.Second):
			t.Fatalf("peek %s: %d of %d messages", queue, len(out), n)
		}
	}
	require.NoError(t, ch.Close())
	require.Eventually(t, func() bool { return r.Count(queue) == n }, 30*time.Second, 20*time.Millisecond)
	return out
}

// idCounts returns how many times each message id is in queue.
func idCounts(t *testing.T, r *testenv.Rabbit, queue string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, d := range peekQueue(t, r, queue) {
		id, _ := d.Headers[headers.UUID].(string)
		out[id]++
	}
	return out
}

type cliTypedError struct{ typ, msg string }

func (e cliTypedError) Error() string     { return e.msg }
func (e cliTypedError) ErrorType() string { return e.typ }

// fillOps declares queue with sluice's topology and dead-letters n messages "m-<i>":
// every fourth one gateway_down (its text differing in numbers), the others
// invalid_amount (differing in ids).
func fillOps(t *testing.T, e *env, queue string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	require.NoError(t, e.amqp.DeclareQueue(ctx, queue))
	// Four records made by the poison step, copied with each message's id: making 20,000
	// records one by one under the race detector takes minutes.
	rec := dlqfill.NewRecorder(t, queue)
	templates := make([]amqp091.Publishing, 4)
	for k := range templates {
		err := sluice.Permanent(cliTypedError{"invalid_amount", fmt.Sprintf("amount must be positive: pay-%d", k)})
		if k == 0 {
			err = cliTypedError{"gateway_down", fmt.Sprintf("gateway: 503 after %dms", 100+k)}
		}
		templates[k] = rec.Publishing(t, dlqfill.Failure{ID: "template", Handler: "payments", Err: err, Payload: []byte(strings.Repeat("x", 512))})
	}
	dlqfill.Publish(t, e.rabbit.Conn, topology.DLQ(queue), n, func(i int) amqp091.Publishing {
		pub := templates[i%4]
		h := make(amqp091.Table, len(pub.Headers))
		for k, v := range pub.Headers {
			h[k] = v
		}
		h[headers.UUID] = fmt.Sprintf("m-%05d", i)
		pub.Headers = h
		return pub
	})
	require.Eventually(t, func() bool { return e.count(t, topology.DLQ(queue)) == n }, 30*time.Second, 20*time.Millisecond)
}

// cliGroups runs `dlq groups --json` and returns its groups.
func cliGroups(t *testing.T, bin, url, queue string, extra ...string) []map[string]any {
	t.Helper()
	res := runSluice(t, bin, url, append([]string{"dlq", "groups", "--queue", queue, "--json"}, extra...)...)
	require.Equal(t, 0, res.code, res)
	var groups []map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &groups), res.stdout)
	return groups
}

// TestDLQCLIOperations runs groups, replay, archive and purge by group, replay --to and
// the not-found exits as an operator would.
func TestDLQCLIOperations(t *testing.T) {
	t.Parallel() // its own queues on the shared node: see the package doc
	e := rabbitEnv(t)
	bin := sluiceCLI(t)
	url := e.rabbit.URL
	queue := e.newQueue(t, "test.dlqops")
	archive := topology.Archive(queue)
	other := queue + ".fixed"
	e.rabbit.DeleteQueues(archive, other)
	fillOps(t, e, queue, 40)
	ch, err := e.rabbit.Conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(other, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	groups := cliGroups(t, bin, url, queue)
	require.Len(t, groups, 2, "two error types, texts differing only in ids and numbers: %v", groups)
	assert.Equal(t, "invalid_amount", groups[0]["error_type"])
	assert.Equal(t, 30.0, groups[0]["count"])
	assert.Equal(t, "gateway_down", groups[1]["error_type"])
	assert.Equal(t, 10.0, groups[1]["count"])
	for _, k := range []string{"id", "handler", "sample", "first_failed_at", "last_failed_at"} {
		assert.NotEmpty(t, groups[0][k], k)
	}
	invalid, gateway := groups[0]["id"].(string), groups[1]["id"].(string)

	res := runSluice(t, bin, url, "dlq", "groups", "--queue", queue)
	require.Equal(t, 0, res.code, res)
	assert.Regexp(t, `(?m)^GROUP\s+COUNT\s+HANDLER\s+ERROR TYPE\s+FIRST FAILED\s+LAST FAILED\s+SAMPLE$`, res.stdout)
	assert.Regexp(t, `(?m)^`+invalid+`\s+30\s+payments\s+invalid_amount\s+`, res.stdout)
	assert.Contains(t, res.stdout, "2 groups, 40 messages in "+topology.DLQ(queue))

	steps := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
		wantErr  string
		counts   map[string]int // queue -> messages after the step
	}{
		{name: "list a group", args: []string{"list", "--group", gateway}, wantOut: "10 matching of 40 messages",
			counts: map[string]int{topology.DLQ(queue): 40}},
		{name: "replay a group", args: []string{"replay", "--group", gateway}, wantOut: "replayed 10 of 40 messages read from " + topology.DLQ(queue),
			counts: map[string]int{queue: 10, topology.DLQ(queue): 30}},
		{name: "a group that matches nothing exits 3", args: []string{"replay", "--group", gateway}, wantCode: 3,
			wantErr: "none of the 30 messages in \"" + queue + ".dlq\" matches --group " + gateway + ": no message matches the selector",
			counts:  map[string]int{queue: 10, topology.DLQ(queue): 30}},
		{name: "archive part of a group", args: []string{"archive", "--group", invalid, "--id", "m-00001", "--id", "m-00002"},
			wantOut: "archived 2 of 30 messages read from " + queue + ".dlq to " + archive + ": m-00001, m-00002",
			counts:  map[string]int{topology.DLQ(queue): 28, archive: 2}},
		{name: "list the archive", args: []string{"list", "--archive"}, wantOut: "2 messages in " + archive},
		{name: "replay from the archive to another queue", args: []string{"replay", "--archive", "--all", "--to", other},
			wantOut: "replayed 2 of 2 messages read from " + archive + " to " + other,
			counts:  map[string]int{archive: 0, other: 2, topology.DLQ(queue): 28}},
		{name: "replay --to a missing queue exits 3", args: []string{"replay", "--all", "--to", queue + ".nowhere"}, wantCode: 3,
			wantErr: "destination queue not found", counts: map[string]int{topology.DLQ(queue): 28}},
		{name: "purge a group needs --yes", args: []string{"purge", "--group", invalid}, wantCode: 2,
			wantErr: "refusing to purge " + queue + ".dlq without --yes: it deletes the selected messages", counts: map[string]int{topology.DLQ(queue): 28}},
		{name: "purge a group", args: []string{"purge", "--group", invalid, "--yes"}, wantOut: "purged 28 of 28 messages",
			counts: map[string]int{topology.DLQ(queue): 0}},
		{name: "an empty DLQ matches nothing", args: []string{"archive", "--all"}, wantCode: 3, wantErr: "no message matches the selector"},
		{name: "an error type that matches nothing", args: []string{"purge", "--error-type", "nope", "--yes"}, wantCode: 3, wantErr: "matches --error-type nope"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			res := runSluice(t, bin, url, append([]string{"dlq", st.args[0], "--queue", queue}, st.args[1:]...)...)
			require.Equal(t, st.wantCode, res.code, res)
			assert.Contains(t, res.stdout, st.wantOut)
			assert.Contains(t, res.stderr, st.wantErr)
			for q, n := range st.counts {
				assert.Equal(t, n, e.count(t, q), "messages in %s", q)
			}
		})
	}
	replayed := peekQueue(t, e.rabbit, queue)
	require.Len(t, replayed, 10)
	for _, d := range replayed {
		assert.Equal(t, "1", d.Headers[headers.ReplayCount])
		assert.Nil(t, d.Headers[sluice.HeaderErrorType], "failure record removed")
	}
}

// TestDLQCLIKilledMidRun SIGKILLs a replay and an archive of 20,000 dead letters, and a
// replay of a quarter of them (the run publishes the others back to the DLQ's tail), in the
// middle of their run, runs them again, and checks every message is exactly once where it
// should be, and the DLQ keeps the others in their order, rotated at the point of the kill.
func TestDLQCLIKilledMidRun(t *testing.T) {
	t.Parallel() // its own queues on the shared node: see the package doc
	const total = 20000
	e := rabbitEnv(t)
	// Without the race detector: this test is about what a killed process leaves behind,
	// and 20,000 messages through a race-instrumented binary take minutes.
	bin := testenv.PlainBinary(t, "./cmd/sluice")
	url := e.rabbit.URL
	cases := []struct {
		name string
		op   string
		dest func(queue string) string
		verb string
		// sel is the selector's flags; selected says which "m-<i>" it selects.
		sel      []string
		selected func(i int) bool
	}{
		{name: "replay", op: "replay", dest: func(q string) string { return q }, verb: "replayed",
			sel: []string{"--all"}, selected: func(int) bool { return true }},
		{name: "archive", op: "archive", dest: topology.Archive, verb: "archived",
			sel: []string{"--all"}, selected: func(int) bool { return true }},
		{name: "replay a quarter", op: "replay", dest: func(q string) string { return q }, verb: "replayed",
			sel: []string{"--error-type", "gateway_down"}, selected: func(i int) bool { return i%4 == 0 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			queue := e.newQueue(t, "test.dlqkill."+tc.op)
			dest := tc.dest(queue)
			e.rabbit.DeleteQueues(topology.Archive(queue))
			fillOps(t, e, queue, total)
			if tc.op == "archive" {
				// The archive must exist for its count to be watched.
				res := runSluice(t, bin, url, "dlq", "archive", "--queue", queue, "--id", "m-00000")
				require.Equal(t, 0, res.code, res)
			}
			start := e.count(t, dest)

			// 40 batches of 500, each holding its transaction open for 40ms before the commit:
			// a kill at a random moment most likely lands in an open transaction.
			args := append([]string{"dlq", tc.op, "--queue", queue, "--batch", "500", "--pace", "40ms"}, tc.sel...)
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), "AMQP_URL="+url)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, cmd.Start())
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			require.Eventually(t, func() bool { return e.count(t, dest)-start >= 1000 }, 2*time.Minute, 5*time.Millisecond,
				"the first run is under way:\n%s", &out)
			require.NoError(t, cmd.Process.Kill()) // SIGKILL: no cleanup, a transaction open
			<-exited

			var moved, left int
			require.Eventually(t, func() bool {
				moved, left = e.count(t, dest), e.count(t, topology.DLQ(queue))
				return moved+left == total
			}, time.Minute, 20*time.Millisecond, "every message either moved or back in the DLQ")
			t.Logf("%s killed after %d of %d messages moved, %d back in the DLQ", tc.op, moved, total, left)
			var want, keep []string
			for i := range total {
				if tc.selected(i) {
					want = append(want, fmt.Sprintf("m-%05d", i))
				} else {
					keep = append(keep, fmt.Sprintf("m-%05d", i))
				}
			}
			require.Less(t, moved, len(want), "killed before it finished:\n%s", &out)

			res := runSluice(t, bin, url, append([]string{"dlq", tc.op, "--queue", queue}, tc.sel...)...)
			require.Equal(t, 0, res.code, res)
			assert.Contains(t, res.stdout, fmt.Sprintf("%s %d of %d messages", tc.verb, len(want)-moved, left))
			var kept []string
			for _, d := range peekQueue(t, e.rabbit, topology.DLQ(queue)) {
				kept = append(kept, fmt.Sprint(d.Headers[headers.UUID]))
			}
			// A run killed midway leaves the DLQ rotated: the messages it had not reached
			// (given back at the head) before the ones it had published back to the tail.
			// Each part keeps its order, and the run again keeps the rotation.
			k := 0
			if len(kept) > 0 {
				k = max(slices.Index(keep, kept[0]), 0)
			}
			if rotated := append(slices.Clone(keep[k:]), keep[:k]...); !slices.Equal(rotated, kept) {
				t.Errorf("the DLQ keeps the %d unselected messages once each, in order from %d; holds %d", len(keep), k, len(kept))
			}
			counts := idCounts(t, e.rabbit, dest)
			assert.Len(t, counts, len(want), "every selected message in %s", dest)
			for _, id := range want {
				if counts[id] != 1 {
					t.Errorf("%s is %d times in %s", id, counts[id], dest)
				}
			}
			t.Logf("%s run again: %d more moved; %s holds %d distinct messages, none twice; the DLQ keeps %d in order",
				tc.op, len(want)-moved, dest, len(counts), len(kept))
		})
	}
}
