// Package testenv finds the real services tests run against. A test that needs RabbitMQ or
// Jaeger and cannot reach it is skipped on a developer's machine, and fails in CI, where
// .ci/run sets SLUICE_REQUIRE_BROKER=1 (and SLUICE_REQUIRE_JAEGER=1).
package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"testing"
	"time"
)

// DefaultAMQPURL is the local RabbitMQ used when AMQP_URL is unset.
const DefaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/"

// AMQPURL returns the RabbitMQ URL for tests, skipping or failing t when it is unreachable.
func AMQPURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("AMQP_URL")
	if u == "" {
		u = DefaultAMQPURL
	}
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatalf("AMQP_URL does not parse")
	}
	host := parsed.Host
	if parsed.Port() == "" {
		host = net.JoinHostPort(parsed.Hostname(), "5672")
	}
	require(t, "SLUICE_REQUIRE_BROKER", "RabbitMQ", host)
	return u
}

// JaegerQueryURL returns Jaeger's query API base URL, skipping or failing t when it is
// unreachable.
func JaegerQueryURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("JAEGER_QUERY_URL")
	if u == "" {
		u = "http://127.0.0.1:16686"
	}
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatalf("JAEGER_QUERY_URL does not parse")
	}
	require(t, "SLUICE_REQUIRE_JAEGER", "Jaeger", parsed.Host)
	return u
}

func require(t testing.TB, env, what, hostport string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", hostport, 2*time.Second)
	if err == nil {
		_ = c.Close()
		return
	}
	if os.Getenv(env) == "1" {
		t.Fatalf("%s is not reachable at %s (%v) and %s=1", what, hostport, err, env)
	}
	t.Skipf("%s is not reachable at %s (%v); set %s=1 to make this a failure", what, hostport, err, env)
}

// Name returns a queue name unique to this test run.
func Name(prefix string) string {
	return fmt.Sprintf("%s.%d.%06d", prefix, time.Now().UnixNano()%1e9, rand.IntN(1e6))
}
