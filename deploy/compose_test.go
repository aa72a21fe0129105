// Package deploy_test checks docker-compose.yml against what the repository tests and ships:
// the RabbitMQ it runs is a version make test runs, the Jaeger is the one tools/jaeger pins,
// Prometheus loads the shipped alert rules and scrapes the payment service, Grafana shows the
// shipped dashboard, and every port stays on 127.0.0.1.
package deploy_test

import (
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// compose is the part of docker-compose.yml the checks read.
type compose struct {
	Services map[string]struct {
		Image string `yaml:"image"`
		Build struct {
			Context    string `yaml:"context"`
			Dockerfile string `yaml:"dockerfile"`
		} `yaml:"build"`
		Environment map[string]string `yaml:"environment"`
		Ports       []string          `yaml:"ports"`
		Volumes     []string          `yaml:"volumes"`
	} `yaml:"services"`
}

func root(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Dir(filepath.Dir(file))
}

func read(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), rel))
	require.NoError(t, err)
	return b
}

func load(t *testing.T) compose {
	t.Helper()
	var c compose
	require.NoError(t, yaml.Unmarshal(read(t, "docker-compose.yml"), &c))
	return c
}

// mounts returns a service's bind mounts, container path to repository path.
func mounts(t *testing.T, volumes []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, v := range volumes {
		parts := strings.Split(v, ":")
		require.GreaterOrEqual(t, len(parts), 2, "volume %q", v)
		m[parts[1]] = filepath.Clean(parts[0])
	}
	return m
}

// Issue 56: docker-compose.yml ran rabbitmq:3.13, a version no test runs. It runs the 4.3
// release make test's part 1 runs, the version docs/reliability.md names.
func TestComposeRunsATestedRabbitMQ(t *testing.T) {
	c := load(t)
	rabbit, ok := c.Services["rabbitmq"]
	require.True(t, ok, "a rabbitmq service")
	m := regexp.MustCompile(`^rabbitmq:(\d+)\.(\d+)\.(\d+)-management$`).FindStringSubmatch(rabbit.Image)
	require.NotNil(t, m, "a pinned official image with the management UI: %q", rabbit.Image)
	series := m[1] + "." + m[2]
	version := series + "." + m[3]
	assert.Contains(t, []string{"4.3", "3.10"}, series, "a series make test runs")
	assert.Contains(t, string(read(t, "docs/reliability.md")), "**RabbitMQ "+version+"**",
		"docs/reliability.md names %s as the version make test runs", version)
	assert.Contains(t, rabbit.Ports, "127.0.0.1:15672:15672", "the management UI")
	plugins := mounts(t, rabbit.Volumes)["/etc/rabbitmq/enabled_plugins"]
	require.NotEmpty(t, plugins, "the plugins file is mounted")
	enabled := string(read(t, plugins))
	for _, p := range []string{"rabbitmq_management", "rabbitmq_prometheus", "rabbitmq_consistent_hash_exchange"} {
		assert.Contains(t, enabled, p)
	}
}

// The Jaeger image is the release tools/jaeger/go.mod pins: Jaeger's v1.N module is release
// 2.(N-63) (v1.76.0 is 2.13.0, as Jaeger's CHANGELOG pairs them), with its web UI published.
func TestComposeRunsThePinnedJaeger(t *testing.T) {
	c := load(t)
	jaeger, ok := c.Services["jaeger"]
	require.True(t, ok, "a jaeger service")
	mod := regexp.MustCompile(`github.com/jaegertracing/jaeger v1\.(\d+)\.(\d+)`).FindStringSubmatch(string(read(t, "tools/jaeger/go.mod")))
	require.NotNil(t, mod, "tools/jaeger/go.mod pins jaeger")
	minor, err := strconv.Atoi(mod[1])
	require.NoError(t, err)
	assert.Equal(t, "jaegertracing/jaeger:2."+strconv.Itoa(minor-63)+"."+mod[2], jaeger.Image)
	assert.Contains(t, jaeger.Ports, "127.0.0.1:16686:16686", "the web UI")
	assert.Contains(t, jaeger.Ports, "127.0.0.1:4318:4318", "OTLP over HTTP")
}

// The payment service is built from this repository and reports to the broker, Jaeger and
// Prometheus of the same file; Prometheus loads the shipped alert rules and scrapes it;
// Grafana shows the shipped dashboard on that Prometheus.
func TestComposeWiresTheServiceToItsObservers(t *testing.T) {
	c := load(t)
	svc, ok := c.Services["payments"]
	require.True(t, ok, "a payments service")
	assert.Equal(t, ".", svc.Build.Context)
	dockerfile := string(read(t, svc.Build.Dockerfile))
	assert.Contains(t, dockerfile, "./cmd/payments", "the Dockerfile builds cmd/payments")
	amqpURL, err := url.Parse(svc.Environment["AMQP_URL"])
	require.NoError(t, err)
	assert.Equal(t, "rabbitmq", amqpURL.Hostname())
	otlp, err := url.Parse(svc.Environment["OTEL_EXPORTER_OTLP_ENDPOINT"])
	require.NoError(t, err)
	assert.Equal(t, "jaeger:4318", otlp.Host)
	metricsPort := strings.TrimPrefix(svc.Environment["METRICS_ADDR"], ":")
	require.NotEmpty(t, metricsPort, "METRICS_ADDR is set")

	prom, ok := c.Services["prometheus"]
	require.True(t, ok, "a prometheus service")
	pm := mounts(t, prom.Volumes)
	assert.Equal(t, filepath.Join("deploy", "prometheus", "alerts.yml"), pm["/etc/prometheus/alerts.yml"], "the shipped alert rules")
	var cfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	require.NoError(t, yaml.Unmarshal(read(t, pm["/etc/prometheus/prometheus.yml"]), &cfg))
	assert.Equal(t, []string{"/etc/prometheus/alerts.yml"}, cfg.RuleFiles)
	var targets []string
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	assert.Contains(t, targets, "payments:"+metricsPort, "Prometheus scrapes the service")

	grafana, ok := c.Services["grafana"]
	require.True(t, ok, "a grafana service")
	gm := mounts(t, grafana.Volumes)
	assert.Equal(t, filepath.Join("deploy", "grafana", "sluice.json"), gm["/var/lib/grafana/dashboards/sluice.json"], "the shipped dashboard")
	var provider struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	require.NoError(t, yaml.Unmarshal(read(t, gm["/etc/grafana/provisioning/dashboards/sluice.yml"]), &provider))
	require.Len(t, provider.Providers, 1)
	assert.Equal(t, "/var/lib/grafana/dashboards", provider.Providers[0].Options.Path, "Grafana loads the folder the dashboard is mounted in")
	var ds struct {
		Datasources []struct {
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	require.NoError(t, yaml.Unmarshal(read(t, gm["/etc/grafana/provisioning/datasources/sluice.yml"]), &ds))
	require.Len(t, ds.Datasources, 1)
	assert.Equal(t, "prometheus", ds.Datasources[0].Type)
	assert.Equal(t, "http://prometheus:9090", ds.Datasources[0].URL)
}

// Every port is published on 127.0.0.1 only, and every file a service mounts is in the
// repository.
func TestComposeStaysOnLoopbackAndMountsWhatExists(t *testing.T) {
	c := load(t)
	require.Len(t, c.Services, 5, "rabbitmq, jaeger, payments, prometheus, grafana")
	for name, s := range c.Services {
		for _, p := range s.Ports {
			assert.True(t, strings.HasPrefix(p, "127.0.0.1:"), "%s publishes %q beyond loopback", name, p)
		}
		for _, src := range mounts(t, s.Volumes) {
			_, err := os.Stat(filepath.Join(root(t), src))
			assert.NoError(t, err, "%s mounts %s", name, src)
		}
	}
}

// docker compose itself accepts the file, where it is installed (it needs no engine for
// this); make test runs the same check and says when it could not.
func TestComposeConfig(t *testing.T) {
	if err := exec.Command("docker", "compose", "version").Run(); err != nil {
		t.Skipf("docker compose is not installed here (%v); make test says so too", err)
	}
	cmd := exec.Command("docker", "compose", "-f", "docker-compose.yml", "config", "-q")
	cmd.Dir = root(t)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
}
