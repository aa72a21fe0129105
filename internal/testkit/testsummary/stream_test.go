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

// Issue 56: every node a test starts reports its real version in the run's output, and the
// run says where its time went.
func TestStreamNodesAndTimings(t *testing.T) {
	const events = `{"Action":"run","Package":"example.com/f","Test":"TestFault"}
{"Action":"output","Package":"example.com/f","Test":"TestFault","Output":"    node.go:250: testenv: started RabbitMQ 4.3.6 node sluice_123456@vm on 127.0.0.1:40111 in 9.1s\n"}
{"Action":"output","Package":"example.com/f","Test":"TestFault","Output":"    node.go:250: testenv: started RabbitMQ 4.3.6 node sluice_654321@vm on 127.0.0.1:40112 in 9.4s\n"}
{"Action":"pass","Package":"example.com/f","Test":"TestFault","Elapsed":31.5}
{"Action":"pass","Package":"example.com/f","Test":"TestFault/sub","Elapsed":30}
{"Action":"pass","Package":"example.com/f","Test":"TestQuick","Elapsed":0.2}
{"Action":"output","Package":"example.com/f","Output":"ok  \texample.com/f\t40.0s\n"}
{"Action":"pass","Package":"example.com/f","Elapsed":40}`
	var out strings.Builder
	s := newStream(&out)
	s.label = "RabbitMQ 4.3.6"
	for _, l := range strings.Split(events, "\n") {
		s.line([]byte(l))
	}
	require.Len(t, s.nodes, 2)
	assert.Equal(t, Node{Name: "sluice_123456@vm", Version: "4.3.6", Package: "example.com/f", Label: "RabbitMQ 4.3.6"}, s.nodes[0])
	assert.Contains(t, NodesReport(append(s.nodes, Node{Name: "n@vm", Version: "3.10.8", Label: "RabbitMQ 3.10.8"})),
		"    2 node(s) RabbitMQ 4.3.6 [RabbitMQ 4.3.6]\n    1 node(s) RabbitMQ 3.10.8 [RabbitMQ 3.10.8]\n")
	assert.Empty(t, NodesReport(nil), "no node started, nothing said")

	assert.Equal(t, []Timing{
		{Package: "example.com/f", Test: "TestFault", Seconds: 31.5, Label: "RabbitMQ 4.3.6"},
		{Package: "example.com/f", Seconds: 40, Label: "RabbitMQ 4.3.6"},
	}, s.timings, "packages, and top-level tests of 5 s or more")
	report := TimingReport(s.timings, 10)
	assert.Contains(t, report, "     40.0 s  example.com/f [RabbitMQ 4.3.6]\n")
	assert.Contains(t, report, "     31.5 s  example.com/f TestFault [RabbitMQ 4.3.6]\n")
}
