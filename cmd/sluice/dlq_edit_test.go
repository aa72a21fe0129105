package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/carry"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// `sluice dlq edit --editor` opens $EDITOR on the payload, JSON indented, and replays what
// was saved; an editor that changes nothing edits nothing, and one that fails edits nothing.
func TestDLQEditWithEditor(t *testing.T) {
	r := testenv.NewRabbit(t)
	queue := testenv.Name("test.cli.editor")
	r.DeleteQueues(queue, topology.DLQ(queue), topology.Archive(queue))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{r.URL}})
	require.NoError(t, err)
	require.NoError(t, b.DeclareQueue(ctx, queue))
	require.NoError(t, b.Close())
	p := carry.New(carry.Carrier{Host: "worker-1"})
	require.NoError(t, err)
	msg := message.NewMessage("pay-ed", []byte(`{"id":"pay-ed","currency":"eur"}`))
	msg.Metadata.Set(amqp.MetadataContentType, "application/json")
	pub, err := amqp.Marshaler{}.Marshal(p.Record(msg, queue, sluice.RetryCount(msg.Metadata), assert.AnError))
	require.NoError(t, err)
	r.Publish(topology.DLQ(queue), pub)

	dir := t.TempDir()
	script := func(name, body string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o700))
		return path
	}
	edit := func(editor string) (int, string, string) {
		var out, errOut bytes.Buffer
		e := &env{stdout: &out, stderr: &errOut, now: time.Now, getenv: func(k string) string {
			return map[string]string{"AMQP_URL": r.URL, "EDITOR": editor}[k]
		}}
		code := run(ctx, e, []string{"dlq", "edit", "--queue", queue, "--id", "pay-ed", "--editor"})
		return code, out.String(), errOut.String()
	}

	t.Run("an editor that fails", func(t *testing.T) {
		code, _, stderr := edit(script("fail.sh", "exit 1"))
		assert.Equal(t, exitFailed, code)
		assert.Contains(t, stderr, "nothing edited")
		assert.Equal(t, 1, r.Count(topology.DLQ(queue)))
	})
	t.Run("an editor that changes nothing", func(t *testing.T) {
		code, _, stderr := edit(script("same.sh", "true"))
		assert.Equal(t, exitUsage, code)
		assert.Contains(t, stderr, "payload unchanged")
		assert.Equal(t, 1, r.Count(topology.DLQ(queue)))
	})
	t.Run("an editor that fixes the payload", func(t *testing.T) {
		seen := filepath.Join(dir, "seen.json")
		code, stdout, stderr := edit(script("fix.sh", `cp "$1" `+seen+` && sed -i 's/"eur"/"EUR"/' "$1"`))
		require.Equal(t, exitOK, code, stderr)
		assert.Contains(t, stdout, "edited pay-ed: replayed to "+queue)
		shown, err := os.ReadFile(seen)
		require.NoError(t, err)
		assert.Contains(t, string(shown), "\n  \"currency\": \"eur\"", "the editor got the payload indented")
		d, ok := r.Get(queue)
		require.True(t, ok)
		assert.JSONEq(t, `{"id":"pay-ed","currency":"EUR"}`, string(d.Body))
		assert.NotEmpty(t, d.Headers[dlq.HeaderEditedBy])
		assert.Equal(t, 1, r.Count(topology.Archive(queue)))
	})
}
