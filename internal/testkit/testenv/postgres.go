package testenv

import (
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// DefaultPostgresPort is the port of this checkout's own PostgreSQL (scripts/postgres.sh)
// when .cache/postgres/port does not name another.
const DefaultPostgresPort = "5433"

// PostgresURL returns the PostgreSQL URL for tests: POSTGRES_URL, else the cluster of this
// checkout's own that scripts/postgres.sh runs from .cache/postgres (make test starts and
// stops it; trust authentication on 127.0.0.1, database test), never the machine's. It
// skips t when the server is unreachable, or fails it in CI (SLUICE_REQUIRE_POSTGRES=1, or
// SLUICE_REQUIRE_BROKER=1, which .ci/run sets).
func PostgresURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("POSTGRES_URL")
	if u == "" {
		port := DefaultPostgresPort
		if b, err := os.ReadFile(filepath.Join(ModuleRoot(t), ".cache", "postgres", "port")); err == nil && strings.TrimSpace(string(b)) != "" {
			port = strings.TrimSpace(string(b))
		}
		u = "postgres://postgres@127.0.0.1:" + port + "/test?sslmode=disable"
	}
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatalf("POSTGRES_URL does not parse")
	}
	host := parsed.Host
	if parsed.Port() == "" {
		host += ":5432"
	}
	env := "SLUICE_REQUIRE_POSTGRES"
	if os.Getenv(env) == "" && os.Getenv("SLUICE_REQUIRE_BROKER") == "1" {
		env = "SLUICE_REQUIRE_BROKER"
	}
	if os.Getenv("POSTGRES_URL") == "" {
		// Say where the default comes from: a skip must tell how to run the test.
		if c, err := net.DialTimeout("tcp", host, 2*time.Second); err != nil {
			if os.Getenv(env) == "1" {
				t.Fatalf("PostgreSQL is not reachable at %s (%v) and %s=1: scripts/postgres.sh start runs this checkout's own (make test does), or set POSTGRES_URL", host, err, env)
			}
			t.Skipf("PostgreSQL is not reachable at %s (%v): scripts/postgres.sh start runs this checkout's own (make test does), or set POSTGRES_URL; set %s=1 to make this a failure", host, err, env)
		} else {
			_ = c.Close()
		}
		return u
	}
	require(t, env, "PostgreSQL", host)
	return u
}
