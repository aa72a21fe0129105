package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A benchmark that logs (sluice's retry events) gets its log lines printed between its name
// and its figures; the figures still belong to it.
func TestParserJoinsFiguresALogLineSeparatedFromTheirName(t *testing.T) {
	p := &parser{}
	for _, l := range []string{
		"pkg: github.com/sluice-go/sluice/router",
		"BenchmarkRetryPath/sluice-2       \t2026/12/02 01:19:43 INFO message handed to the broker for a retry queue=q attempt=1",
		"2026/12/02 01:19:43 INFO message handed to the broker for a retry queue=q attempt=1",
		"2026/12/02 01:19:47 WARN retry and dead-letter log lines dropped by the rate limit dropped=137",
		"     210\t   7154923 ns/op\t       139.8 msgs/s\t   43416 B/op\t     434 allocs/op",
		"BenchmarkRetryPath/raw-2          \t     162\t   7705883 ns/op\t       129.8 msgs/s",
	} {
		p.line(l)
	}
	require.Len(t, p.results, 2)
	assert.Equal(t, "BenchmarkRetryPath/sluice", p.results[0].name)
	assert.Equal(t, 210, p.results[0].n)
	assert.Equal(t, 139.8, p.results[0].metrics["msgs/s"])
	assert.Equal(t, "BenchmarkRetryPath/raw", p.results[1].name)
	assert.Equal(t, 129.8, p.results[1].metrics["msgs/s"])
}
