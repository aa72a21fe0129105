package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/retrystats"
	"github.com/sluice-go/sluice/policy"
)

func TestPolicy(t *testing.T) {
	base := fakeService(t)
	env := map[string]string{"SLUICE_SERVICE_URL": strings.Replace(base, "http://", "http://ops:s3cr3tpw@", 1)}
	masked := strings.Replace(base, "http://", "http://ops:xxxxx@", 1) + policyPath
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, stdout string)
	}{
		{name: "text", check: func(t *testing.T, out string) {
			assert.Contains(t, out, "Retry policy of the service at "+masked+".")
			assert.Contains(t, out, "\nHandler pay\n")
			assert.Contains(t, out, "\nHandler ship\n")
			assert.Regexp(t, `queue\s+cli\.pay\n`, out)
			assert.Regexp(t, `dead-letter queue\s+cli\.pay\.dlq\n`, out)
			assert.Regexp(t, `archive\s+cli\.pay\.dlq\.archive\n`, out)
			assert.Regexp(t, `max attempts\s+4 \(3 retries\)`, out)
			assert.Regexp(t, `settle bound\s+every delivery settled within 1m41s of its delivery`, out)
			assert.Regexp(t, `retry 1\s+100ms \(100ms – 100ms\), attempt 2 at \+100ms`, out)
			assert.Regexp(t, `retry 3\s+400ms \(400ms – 400ms\), attempt 4 at \+700ms`, out)
			assert.Regexp(t, `down\s+stop retrying \(exploring 5%\): 0 of 12 recovered in the last hour\n`, out)
			assert.Regexp(t, `permanent\s+dead-lettered to cli\.(pay|ship)\.dlq at once`, out)
		}},
		{name: "JSON", args: []string{"--json"}, check: func(t *testing.T, out string) {
			var d policyReport
			require.NoError(t, json.Unmarshal([]byte(out), &d))
			assert.Equal(t, sourceService, d.Source)
			assert.Equal(t, masked, d.URL)
			require.Len(t, d.Handlers, 2)
			pay := d.Handlers[0]
			assert.Equal(t, "pay", pay.Name)
			assert.Equal(t, "cli.pay", pay.Queue)
			assert.Equal(t, "cli.pay.dlq", pay.DeadLetterQueue)
			assert.Equal(t, 4, pay.Retry.MaxAttempts)
			var delays []time.Duration
			for _, r := range pay.Retry.Schedule {
				delays = append(delays, time.Duration(r.Delay))
			}
			assert.Equal(t, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}, delays)
			require.Len(t, d.Handlers[1].Learned, 1)
			assert.Equal(t, policy.LearnedView{ErrorType: "down", Verdict: retrystats.Verdict{
				Decision: retrystats.DecisionStop, Exploring: true, Explore: 0.05, Evidence: "0 of 12 recovered in the last hour",
				Reason: "dead-lettered at once (5% explored): 0 of 12 recovered in the last hour"}}, d.Handlers[1].Learned[0])
		}},
		{name: "Markdown", args: []string{"--markdown"}, check: func(t *testing.T, out string) {
			assert.True(t, strings.HasPrefix(out, "# Retry decision matrix\n\nRead from the service at "+masked+".\n"), out)
			assert.Contains(t, out, "## Handler `pay`")
			assert.Contains(t, out, "| 2 | 3 | 200ms | 200ms – 200ms | 300ms |")
		}},
		{name: "one handler", args: []string{"--json", "--handler", "ship"}, check: func(t *testing.T, out string) {
			var d policyReport
			require.NoError(t, json.Unmarshal([]byte(out), &d))
			require.Len(t, d.Handlers, 1)
			assert.Equal(t, "ship", d.Handlers[0].Name)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runTraceCLI(env, append([]string{"policy"}, tc.args...)...)
			require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			tc.check(t, stdout)
			assert.NotContains(t, stdout+stderr, "s3cr3tpw")
		})
	}
}

func TestPolicy_Failures(t *testing.T) {
	base := fakeService(t)
	tests := []struct {
		name       string
		env        map[string]string
		args       []string
		wantCode   int
		wantStderr []string
	}{
		{name: "unreachable", env: map[string]string{"SLUICE_SERVICE_URL": "http://ops:s3cr3tpw@127.0.0.1:1"}, wantCode: exitFailed,
			wantStderr: []string{"cannot reach the service at http://ops:xxxxx@127.0.0.1:1" + policyPath, "SLUICE_SERVICE_URL", "PROMETHEUS_URL"}},
		{name: "no such handler", env: map[string]string{"SLUICE_SERVICE_URL": base}, args: []string{"--handler", "nope"}, wantCode: exitNotFound,
			wantStderr: []string{`has no handler "nope"`}},
		{name: "both formats", args: []string{"--json", "--markdown"}, wantCode: exitUsage, wantStderr: []string{"give --json or --markdown, not both"}},
		{name: "an argument", args: []string{"x"}, wantCode: exitUsage, wantStderr: []string{"unexpected arguments"}},
		{name: "help", args: []string{"--help"}, wantCode: exitOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runTraceCLI(tc.env, append([]string{"policy"}, tc.args...)...)
			assert.Equal(t, tc.wantCode, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			for _, w := range tc.wantStderr {
				assert.Contains(t, stderr, w)
			}
			assert.NotContains(t, stdout+stderr, "s3cr3tpw")
		})
	}
}
