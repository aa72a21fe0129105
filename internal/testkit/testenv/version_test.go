package testenv_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

func TestSeriesOf(t *testing.T) {
	for _, tt := range []struct{ version, want string }{
		{"4.3.6", "4.3"},
		{"3.10.8", "3.10"},
		{"4.3.10", "4.3"},
		{"4.4.0-rc.1", "4.4"},
		{"4", "4"},
	} {
		assert.Equal(t, tt.want, testenv.SeriesOf(tt.version), tt.version)
	}
}

// A node's version is what it wrote as it booted, the last boot's when it was restarted;
// the upgrade log is not its log.
func TestLoggedVersion(t *testing.T) {
	dir := t.TempDir()
	assert.Empty(t, testenv.LoggedVersion(dir), "no log yet")
	log := "2026-12-06 06:27:17.206003+00:00 [info] <0.209.0>  Starting RabbitMQ 4.3.5 on Erlang 29.1.2 [jit]\n" +
		"2026-12-06 06:27:18.642415+00:00 [info] <0.869.0> Server startup complete; 4 plugins started.\n" +
		"2026-12-06 07:27:17.206003+00:00 [info] <0.209.0>  Starting RabbitMQ 4.3.6 on Erlang 29.1.2 [jit]\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "n@vm.log"), []byte(log), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "n@vm_upgrade.log"), []byte("Starting RabbitMQ 9.9.9 on Erlang 1\n"), 0o600))
	assert.Equal(t, "4.3.6", testenv.LoggedVersion(dir))
}

// Issue 56: the tests' version label came from SLUICE_RABBITMQ, whatever the node was. It is
// the node's own, as it says when a connection opens.
func TestVersionIsTheNodes(t *testing.T) {
	url := testenv.AMQPURL(t)
	want, err := testenv.BrokerVersion(url, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, want, testenv.Version())
	assert.Equal(t, testenv.SeriesOf(want), testenv.Series())
	assert.Equal(t, testenv.Series() == testenv.RabbitMQ43, testenv.Is43())
}

// A run that claims another series than its node's fails, naming the version found: the
// day the 4.3 chroot holds 4.4, nothing is labelled 4.3.
func TestVersionRefusesAnotherSeries(t *testing.T) {
	if os.Getenv("TESTENV_VERSION_CHILD") == "1" {
		_ = testenv.Version()
		return
	}
	url := testenv.AMQPURL(t)
	actual, err := testenv.BrokerVersion(url, 5*time.Second)
	require.NoError(t, err)
	claim := testenv.RabbitMQ43
	if testenv.SeriesOf(actual) == claim {
		claim = testenv.RabbitMQ310
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestVersionRefusesAnotherSeries$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TESTENV_VERSION_CHILD=1", "SLUICE_RABBITMQ="+claim, "AMQP_URL="+url)
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "the claim %s against a %s node must fail: %s", claim, actual, out)
	assert.Contains(t, string(out), "is "+actual+", not "+claim+".x as SLUICE_RABBITMQ="+claim+" claims")
	assert.NotContains(t, string(out), ":guest@", "the URL's password is masked")
}

// Without a node to ask, the claimed series stands (the tests that need the node skip or
// fail on their own).
func TestBrokerVersionWithoutANode(t *testing.T) {
	_, err := testenv.BrokerVersion("amqp://guest:s3cret@127.0.0.1:1/", time.Second)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "s3cret")
}
