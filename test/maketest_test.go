package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// Issue 17: `make test` passed while skipping every broker test when RabbitMQ was not
// running. scripts/test.sh (what make test runs) now ends such a run with a loud list of
// what skipped and why, and with SLUICE_REQUIRE_BROKER=1 (CI) the run fails instead.
func TestMakeTestSaysWhatItSkipped(t *testing.T) {
	root := testenv.ModuleRoot(t)
	// A broker address nothing listens on, so the example's RabbitMQ test cannot run. It is
	// not the default 127.0.0.1:5672, which the script would try to start a node on.
	closed := fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", testenv.FreePort(t))
	tests := []struct {
		name        string
		requireBkr  string
		wantErr     bool
		wantOutputs []string
	}{
		{"developer machine: passes, and says loudly what it skipped", "", false, []string{
			// The example's two broker tests, counted and named.
			"SKIPPED: 2 tests did not run, so this run did NOT test everything",
			"2 skipped: RabbitMQ is not reachable at 127.0.0.1:",
			"github.com/sluice-go/sluice/examples/quickstart [RabbitMQ 3.10]: ",
			"TestRunAgainstRabbitMQ",
			"TestQuickstartServesWhatTheDashboardAndAlertsRead",
			"make test: PASS",
		}},
		{"CI: fails instead of skipping", "1", true, []string{
			"--- FAIL: TestRunAgainstRabbitMQ",
			"make test: FAIL",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "test.sh"))
			cmd.Dir = root
			cmd.Env = append(withoutEnv(os.Environ(), "SLUICE_REQUIRE_BROKER", "AMQP_URL", "PKGS", "SLUICE_RABBITMQ"),
				"AMQP_URL="+closed,
				"SLUICE_REQUIRE_BROKER="+tt.requireBkr,
				"PKGS=./examples/quickstart",
				"SLUICE_TEST_JAEGER=0", // the shared Jaeger is not this test's to start or stop
				"SLUICE_TEST_CHAOS=0",
				"SLUICE_TEST_FAULTS=0", // the fault suite runs once, after this package, in CI
				// The 4.3 node is the outer run's: this run must neither use nor stop it.
				"SLUICE_TEST_RABBITMQ43=0",
				"SLUICE_TEST_PROVISION=0", // the outer run provisioned the machine
			)
			out, err := cmd.CombinedOutput()
			if tt.wantErr {
				require.Error(t, err, "%s", out)
			} else {
				require.NoError(t, err, "%s", out)
			}
			for _, want := range tt.wantOutputs {
				assert.Contains(t, string(out), want)
			}
			if tt.wantErr {
				assert.NotContains(t, string(out), "SKIPPED", "in CI nothing skips")
			} else {
				assert.Contains(t, string(out), "ok  \tgithub.com/sluice-go/sluice/examples/quickstart", "go test's own lines are kept")
			}
		})
	}
}

// withoutEnv returns env without the named variables.
func withoutEnv(env []string, names ...string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, n := range names {
			keep = keep && name != n
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}
