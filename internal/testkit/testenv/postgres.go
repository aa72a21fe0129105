package testenv

import (
	"net/url"
	"os"
	"testing"
)

// DefaultPostgresURL is the local PostgreSQL used when POSTGRES_URL is unset: the
// machine's cluster on 5432 with trust authentication, database test (.ci/run starts it).
const DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// PostgresURL returns the PostgreSQL URL for tests (POSTGRES_URL, else DefaultPostgresURL),
// skipping t when it is unreachable, or failing it in CI (SLUICE_REQUIRE_POSTGRES=1, or
// SLUICE_REQUIRE_BROKER=1, which .ci/run sets).
func PostgresURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("POSTGRES_URL")
	if u == "" {
		u = DefaultPostgresURL
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
	require(t, env, "PostgreSQL", host)
	return u
}
