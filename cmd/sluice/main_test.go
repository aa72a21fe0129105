package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// runIn runs the CLI in-process with AMQP_URL set to amqpURL.
func runIn(amqpURL string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut, now: time.Now, getenv: func(k string) string {
		if k == "AMQP_URL" {
			return amqpURL
		}
		return ""
	}}
	code = run(context.Background(), e, args)
	return code, out.String(), errOut.String()
}

// These cases need no broker: they fail before connecting, or connect to a closed port.
func TestRunExitCodes(t *testing.T) {
	const secret = "hunter2secret"
	unreachable := "amqp://ops:" + secret + "@127.0.0.1:1/"
	cases := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
		notStdout  string
	}{
		{name: "no command", args: nil, wantCode: exitUsage, wantStderr: "sluice: no command given"},
		{name: "help", args: []string{"help"}, wantCode: exitOK, wantStdout: "dlq      inspect, replay and purge"},
		{name: "unknown command", args: []string{"frobnicate"}, wantCode: exitUsage, wantStderr: `unknown command "frobnicate"`},
		{name: "dlq without a command", args: []string{"dlq"}, wantCode: exitUsage, wantStderr: "sluice dlq: no command given"},
		{name: "dlq help lists its commands", args: []string{"dlq", "help"}, wantCode: exitOK, wantStdout: "replay   send messages back"},
		{name: "command help", args: []string{"dlq", "list", "-h"}, wantCode: exitOK, wantStdout: "Usage: sluice dlq list --queue Q"},
		{name: "replay help hides the test hook", args: []string{"dlq", "replay", "--help"}, wantCode: exitOK, wantStdout: "--older-than D", notStdout: "pace"},
		{name: "missing --queue", args: []string{"dlq", "stats"}, wantCode: exitUsage, wantStderr: "sluice dlq stats: --queue is required"},
		{name: "unknown flag", args: []string{"dlq", "list", "--queue", "q", "--bogus"}, wantCode: exitUsage, wantStderr: "flag provided but not defined: -bogus"},
		{name: "show without an id", args: []string{"dlq", "show", "--queue", "q"}, wantCode: exitUsage, wantStderr: "want exactly one message ID, got 0"},
		{name: "show with two ids", args: []string{"dlq", "show", "a", "--queue", "q", "b"}, wantCode: exitUsage, wantStderr: "got 2 arguments"},
		{name: "list with an argument", args: []string{"dlq", "list", "--queue", "q", "extra"}, wantCode: exitUsage, wantStderr: `unexpected argument "extra"`},
		{name: "replay without a selector", args: []string{"dlq", "replay", "--queue", "q"}, wantCode: exitUsage, wantStderr: "one selector is required"},
		{name: "replay --all with a filter", args: []string{"dlq", "replay", "--queue", "q", "--all", "--error-type", "x"}, wantCode: exitUsage, wantStderr: "--all cannot be combined"},
		{name: "replay with a bad age", args: []string{"dlq", "replay", "--queue", "q", "--older-than", "soon"}, wantCode: exitUsage, wantStderr: "invalid value"},
		{name: "purge without --yes", args: []string{"dlq", "purge", "--queue", "q"}, wantCode: exitUsage, wantStderr: "refusing to purge q.dlq without --yes"},
		{name: "purge of a group without --yes", args: []string{"dlq", "purge", "--queue", "q", "--group", "g"}, wantCode: exitUsage, wantStderr: "refusing to purge q.dlq without --yes: it deletes the selected messages"},
		{name: "purge of the archive without --yes", args: []string{"dlq", "purge", "--queue", "q", "--archive"}, wantCode: exitUsage, wantStderr: "refusing to purge q.dlq.archive without --yes"},
		{name: "dlq help lists groups and archive", args: []string{"dlq", "help"}, wantCode: exitOK, wantStdout: "archive  move messages to Q.dlq.archive"},
		{name: "groups help", args: []string{"dlq", "groups", "-h"}, wantCode: exitOK, wantStdout: "first_failed_at and last_failed_at"},
		{name: "archive without a selector", args: []string{"dlq", "archive", "--queue", "q"}, wantCode: exitUsage, wantStderr: "one selector is required: --id, --group"},
		{name: "archive with a bad retention", args: []string{"dlq", "archive", "--queue", "q", "--all", "--retention", "-1h"}, wantCode: exitUsage, wantStderr: "--retention must be positive"},
		{name: "archive with a bad type", args: []string{"dlq", "archive", "--queue", "q", "--all", "--archive-type", "stream"}, wantCode: exitUsage, wantStderr: "--archive-type must be classic or quorum"},
		{name: "replay --all with a group", args: []string{"dlq", "replay", "--queue", "q", "--all", "--group", "g"}, wantCode: exitUsage, wantStderr: "--all cannot be combined"},
		{name: "replay --all with a reason", args: []string{"dlq", "replay", "--queue", "q", "--all", "--reason", "retry_unlikely"}, wantCode: exitUsage, wantStderr: "--all cannot be combined"},
		{name: "unreachable broker: groups", args: []string{"dlq", "groups", "--queue", "q"}, wantCode: exitFailed, wantStderr: "connect to RabbitMQ at amqp://ops:xxxxx@127.0.0.1:1/"},
		{name: "unreachable broker", args: []string{"dlq", "list", "--queue", "q"}, wantCode: exitFailed, wantStderr: "connect to RabbitMQ at amqp://ops:xxxxx@127.0.0.1:1/"},
		{name: "unreachable broker, id after flags", args: []string{"dlq", "show", "--queue", "q", "--", "-odd-id"}, wantCode: exitFailed, wantStderr: "amqp://ops:xxxxx@127.0.0.1:1/"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runIn(unreachable, tc.args...)
			assert.Equal(t, tc.wantCode, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			assert.Contains(t, stdout, tc.wantStdout)
			assert.Contains(t, stderr, tc.wantStderr)
			if tc.notStdout != "" {
				assert.NotContains(t, stdout, tc.notStdout)
			}
			assert.NotContains(t, stdout+stderr, secret)
		})
	}
}

func TestRedact(t *testing.T) {
	cases := []struct {
		name, text, url, want string
	}{
		{name: "URL", text: "dial amqp://u:pw1@h:5672/ failed", url: "amqp://u:pw1@h:5672/", want: "dial amqp://u:xxxxx@h:5672/ failed"},
		{name: "password alone", text: "auth pw1 refused", url: "amqp://u:pw1@h/", want: "auth xxxxx refused"},
		{name: "one of a list", text: "b: pw2", url: "amqp://u:pw1@a/, amqp://u:pw2@b/", want: "b: xxxxx"},
		{name: "no password", text: "amqp://h/ down", url: "amqp://h/", want: "amqp://h/ down"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, redact(tc.text, tc.url))
		})
	}
}

func TestFmtAge(t *testing.T) {
	cases := []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{42 * time.Second, "42s"},
		{3*time.Minute + 7*time.Second, "3m07s"},
		{2*time.Hour + 5*time.Minute, "2h05m"},
		{76 * time.Hour, "3d04h"},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			assert.Equal(t, tc.want, fmtAge(tc.d))
		})
	}
}
