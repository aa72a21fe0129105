package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

type nopDeadLetterer struct{}

func (nopDeadLetterer) DeadLetter(context.Context, string, *message.Message) error {
	return errors.New("not used")
}

// cliPayload is a JSON payload of n bytes quoting a broker URL with its password.
func cliPayload(n int) []byte {
	head := []byte(`{"broker":"amqp://admin:payload-pw@rabbit:5672/","blob":"`)
	tail := []byte(`"}`)
	return append(append(head, bytes.Repeat([]byte("z"), n-len(head)-len(tail))...), tail...)
}

// TestDLQShowDisplay runs `sluice dlq show` and `list` on 5 MB and 20 MB (15 MB on RabbitMQ 4.3) dead letters with
// credentials in their payload and headers, and on an id two messages share.
func TestDLQShowDisplay(t *testing.T) {
	r := testenv.NewRabbit(t)
	queue := testenv.Name("test.cli.display")
	r.DeleteQueues(queue, topology.DLQ(queue))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{r.URL}})
	require.NoError(t, err)
	require.NoError(t, b.DeclareQueue(ctx, queue))
	require.NoError(t, b.Close())
	p := carry.New(carry.Carrier{Host: "worker-1"})
	require.NoError(t, err)
	deadLetter := func(id string, payload []byte) {
		msg := message.NewMessage(id, payload)
		msg.Metadata.Set("x-db", "postgres://app:header-pw@db/app")
		msg.Metadata.Set("Authorization", "Bearer auth-pw")
		rec := p.Record(msg, queue, sluice.RetryCount(msg.Metadata), errors.New("dial amqp://ops:error-pw@rabbit failed"))
		rec.Metadata.Set(headers.Handler, "payments")
		pub, err := amqp.Marshaler{}.Marshal(rec)
		require.NoError(t, err)
		r.Publish(topology.DLQ(queue), pub)
	}
	const mib = 1 << 20
	large := testenv.LargeMessageBytes() // 20 MiB, 15 MiB on RabbitMQ 4.3 (its max_message_size is 16 MiB)
	deadLetter("dup", []byte(`{"n":1}`))
	deadLetter("big-5mb", cliPayload(5*mib))
	deadLetter("big-large", cliPayload(large))
	deadLetter("dup", []byte(`{"n":2}`))
	require.Eventually(t, func() bool { return r.Count(topology.DLQ(queue)) == 4 }, 10*time.Second, 20*time.Millisecond)
	secrets := []string{"payload-pw", "header-pw", "auth-pw", "error-pw"}
	show := func(t *testing.T, args ...string) string {
		t.Helper()
		code, out, errOut := runIn(r.URL, append([]string{"dlq", "show", "--queue", queue}, args...)...)
		require.Equal(t, exitOK, code, "stderr: %s", errOut)
		for _, s := range secrets {
			assert.NotContains(t, out, s)
		}
		return out
	}

	for _, tc := range []struct {
		id   string
		size int
	}{{"big-5mb", 5 * mib}, {"big-large", large}} {
		t.Run(tc.id, func(t *testing.T) {
			out := show(t, tc.id)
			t.Logf("dlq show %s: %d bytes", tc.id, len(out))
			assert.Less(t, len(out), 64<<10)
			assert.Contains(t, out, "Payload ("+strconv.Itoa(tc.size)+" bytes, utf-8, first ")
			assert.Contains(t, out, "--full prints all of it, --payload-file F writes it byte for byte")
			assert.Contains(t, out, "amqp://admin:xxxxx@rabbit:5672/")
			assert.Regexp(t, `Authorization:\s+xxxxx\n`, out)
			assert.Contains(t, out, "postgres://app:xxxxx@db/app")
			assert.Contains(t, out, "dial amqp://ops:xxxxx@rabbit failed")

			js := show(t, "--json", tc.id)
			t.Logf("dlq show --json %s: %d bytes", tc.id, len(js))
			assert.Less(t, len(js), 64<<10)
			assert.Contains(t, js, `"payload_bytes": `+strconv.Itoa(tc.size))

			if tc.size <= 5*mib { // the large one would only take longer
				full := show(t, "--full", tc.id)
				assert.Greater(t, len(full), tc.size, "--full prints the whole payload, masked")
			}

			file := filepath.Join(t.TempDir(), "payload")
			show(t, "--payload-file", file, tc.id)
			got, err := os.ReadFile(file)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(cliPayload(tc.size), got), "--payload-file writes the exact bytes")
		})
	}
	t.Run("list", func(t *testing.T) {
		for _, args := range [][]string{{}, {"--json"}} {
			code, out, errOut := runIn(r.URL, append([]string{"dlq", "list", "--queue", queue}, args...)...)
			require.Equal(t, exitOK, code, "stderr: %s", errOut)
			t.Logf("dlq list %v: %d bytes", args, len(out))
			assert.Less(t, len(out), 64<<10)
			for _, s := range secrets {
				assert.NotContains(t, out, s)
			}
		}
	})
	t.Run("duplicate id", func(t *testing.T) {
		out := show(t, "dup")
		assert.Contains(t, out, "2 messages in "+topology.DLQ(queue)+" hold id dup, at positions 1, 4")
		assert.Contains(t, out, `{"n":1}`)
		assert.Contains(t, out, `{"n":2}`)
		out = show(t, "--position", "4", "dup")
		assert.Contains(t, out, `{"n":2}`)
		assert.NotContains(t, out, `{"n":1}`)
		assert.Contains(t, out, "Same id also at positions: 1")
		code, _, errOut := runIn(r.URL, "dlq", "show", "--queue", queue, "--payload-file", filepath.Join(t.TempDir(), "p"), "dup")
		assert.Equal(t, exitUsage, code)
		assert.Contains(t, errOut, "name one with --position")
		code, _, _ = runIn(r.URL, "dlq", "show", "--queue", queue, "--position", "2", "dup")
		assert.Equal(t, exitNotFound, code)

		code, out, errOut = runIn(r.URL, "dlq", "replay", "--queue", queue, "--id", "dup")
		require.Equal(t, exitOK, code, "stderr: %s", errOut)
		assert.Contains(t, out, "id dup: 2 messages held it, replayed all 2")
		require.Eventually(t, func() bool { return r.Count(queue) == 2 }, 10*time.Second, 20*time.Millisecond)
	})
}
