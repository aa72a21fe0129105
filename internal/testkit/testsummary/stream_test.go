package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A run as `go test -json` reports it: one package passes with a skipped test, one fails.
const run = `{"Action":"start","Package":"example.com/a"}
{"Action":"run","Package":"example.com/a","Test":"TestBroker"}
{"Action":"output","Package":"example.com/a","Test":"TestBroker","Output":"=== RUN   TestBroker\n"}
{"Action":"output","Package":"example.com/a","Test":"TestBroker","Output":"    testenv.go:64: RabbitMQ is not reachable at 127.0.0.1:5672 (connection refused); set SLUICE_REQUIRE_BROKER=1 to make this a failure\n"}
{"Action":"output","Package":"example.com/a","Test":"TestBroker","Output":"--- SKIP: TestBroker (0.00s)\n"}
{"Action":"skip","Package":"example.com/a","Test":"TestBroker"}
{"Action":"run","Package":"example.com/a","Test":"TestPure"}
{"Action":"output","Package":"example.com/a","Test":"TestPure","Output":"=== RUN   TestPure\n"}
{"Action":"output","Package":"example.com/a","Test":"TestPure","Output":"--- PASS: TestPure (0.00s)\n"}
{"Action":"pass","Package":"example.com/a","Test":"TestPure"}
{"Action":"output","Package":"example.com/a","Output":"PASS\n"}
{"Action":"output","Package":"example.com/a","Output":"ok  \texample.com/a\t0.01s\n"}
{"Action":"pass","Package":"example.com/a"}
{"Action":"run","Package":"example.com/b","Test":"TestBad"}
{"Action":"output","Package":"example.com/b","Test":"TestBad","Output":"=== RUN   TestBad\n"}
{"Action":"output","Package":"example.com/b","Test":"TestBad","Output":"    b_test.go:9: want 1, got 2\n"}
{"Action":"output","Package":"example.com/b","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"example.com/b","Test":"TestBad"}
{"Action":"output","Package":"example.com/b","Output":"FAIL\n"}
{"Action":"output","Package":"example.com/b","Output":"FAIL\texample.com/b\t0.01s\n"}
{"Action":"fail","Package":"example.com/b"}
{"Action":"output","Package":"example.com/c","Output":"?   \texample.com/c\t[no test files]\n"}
{"Action":"skip","Package":"example.com/c"}
`

func TestStream(t *testing.T) {
	var out strings.Builder
	s := newStream(&out)
	var skips []Skip
	for _, l := range strings.Split(strings.TrimSpace(run), "\n") {
		skips = append(skips, s.line([]byte(l))...)
	}
	assert.True(t, s.failed)
	assert.Equal(t, "ok  \texample.com/a\t0.01s\n"+
		"    b_test.go:9: want 1, got 2\n--- FAIL: TestBad (0.00s)\nFAIL\nFAIL\texample.com/b\t0.01s\n"+
		"?   \texample.com/c\t[no test files]\n", out.String(), "go test's terse output")
	require.Equal(t, []Skip{{
		Package: "example.com/a", Test: "TestBroker",
		Reason: "RabbitMQ is not reachable at 127.0.0.1:5672 (connection refused); set SLUICE_REQUIRE_BROKER=1 to make this a failure",
	}}, skips, "a package without tests is not a skipped test")
}

func TestReport(t *testing.T) {
	assert.Empty(t, Report(nil), "nothing skipped, nothing said")
	broker := "RabbitMQ is not reachable at 127.0.0.1:5672"
	got := Report([]Skip{
		{Package: "p/test", Test: "TestA", Reason: broker},
		{Package: "p/dlq", Test: "TestB", Reason: broker},
		{Package: "p/test", Test: "TestC/sub", Reason: broker},
		{Package: "p/ui", Test: "TestD", Reason: "chromium not installed"},
	})
	assert.Contains(t, got, "SKIPPED: 4 tests did not run")
	assert.Contains(t, got, "3 skipped: "+broker+"\n  p/dlq: TestB\n  p/test: TestA, TestC/sub\n")
	assert.Contains(t, got, "1 skipped: chromium not installed\n  p/ui: TestD\n")
	assert.Less(t, strings.Index(got, broker), strings.Index(got, "chromium"), "the largest group first")
}

// make test runs parts on two RabbitMQ versions: each closing line and each skip says which.
func TestStreamLabel(t *testing.T) {
	var out strings.Builder
	s := newStream(&out)
	s.label = "RabbitMQ 4.3"
	var skips []Skip
	for _, l := range strings.Split(strings.TrimSpace(run), "\n") {
		skips = append(skips, s.line([]byte(l))...)
	}
	assert.Contains(t, out.String(), "ok  \texample.com/a\t0.01s\t[RabbitMQ 4.3]\n")
	assert.Contains(t, out.String(), "FAIL\texample.com/b\t0.01s\t[RabbitMQ 4.3]\n")
	assert.Contains(t, out.String(), "?   \texample.com/c\t[no test files]\t[RabbitMQ 4.3]\n")
	assert.Contains(t, out.String(), "\nFAIL\n", "go test's bare FAIL line is not a closing line")
	require.Len(t, skips, 1)
	assert.Equal(t, "RabbitMQ 4.3", skips[0].Label)
	assert.Contains(t, Report(append(skips, Skip{Package: "example.com/a", Test: "TestBroker", Reason: skips[0].Reason, Label: "RabbitMQ 3.10"})),
		"2 skipped: RabbitMQ is not reachable at 127.0.0.1:5672 (connection refused); set SLUICE_REQUIRE_BROKER=1 to make this a failure\n"+
			"  example.com/a [RabbitMQ 3.10]: TestBroker\n  example.com/a [RabbitMQ 4.3]: TestBroker\n")
}
