package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseResult(t *testing.T) {
	cases := []struct {
		name string
		line string
		ok   bool
		want result
	}{
		{
			name: "go's own metrics with a GOMAXPROCS suffix",
			line: "BenchmarkStackInProcess/sluice-2  \t  545468\t      2242 ns/op\t     327 B/op\t       4 allocs/op",
			ok:   true,
			want: result{name: "BenchmarkStackInProcess/sluice", n: 545468, metrics: map[string]float64{"ns/op": 2242, "B/op": 327, "allocs/op": 4}},
		},
		{
			name: "custom metrics with fractions",
			line: "BenchmarkRetryPath/sluice-2       \t     100\t1245923191 ns/op\t         0.8026 msgs/s",
			ok:   true,
			want: result{name: "BenchmarkRetryPath/sluice", n: 100, metrics: map[string]float64{"ns/op": 1245923191, "msgs/s": 0.8026}},
		},
		{
			name: "no suffix when GOMAXPROCS is 1",
			line: "BenchmarkPlain 	 1000	 1500 ns/op",
			ok:   true,
			want: result{name: "BenchmarkPlain", n: 1000, metrics: map[string]float64{"ns/op": 1500}},
		},
		{
			name: "a name ending in a non-numeric dash part keeps it",
			line: "BenchmarkX/with-dash 	 10	 5 ns/op",
			ok:   true,
			want: result{name: "BenchmarkX/with-dash", n: 10, metrics: map[string]float64{"ns/op": 5}},
		},
		{name: "a name alone (the benchmark printed output)", line: "BenchmarkConsume/sluice", ok: false},
		{name: "a failure line", line: "--- FAIL: BenchmarkConsume/sluice", ok: false},
		{name: "a package summary", line: "ok  \tgithub.com/sluice-go/sluice/router\t203.051s", ok: false},
		{name: "a non-numeric iteration count", line: "BenchmarkX-2  many  5 ns/op", ok: false},
		{name: "a value that is not a number", line: "BenchmarkX-2  10  fast ns/op", ok: false},
		{name: "a dangling value without unit", line: "BenchmarkX-2  10  5 ns/op 7", ok: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseResult(tc.line)
			require.Equal(t, tc.ok, ok)
			if tc.ok {
				assert.Equal(t, tc.want, got)
			}
		})
	}
}

func TestParserTracksPackage(t *testing.T) {
	p := &parser{}
	lines := []string{
		"goos: linux",
		"pkg: github.com/sluice-go/sluice/broker/amqp",
		"cpu: AMD EPYC",
		"BenchmarkConfirmedPublish/sluice-2 \t 10000\t 316293 ns/op\t 3162 msgs/s",
		"PASS",
		"pkg: github.com/sluice-go/sluice/router",
		"BenchmarkConsume/raw-2 \t 100\t 5 ns/op",
	}
	var counted int
	for _, l := range lines {
		if p.line(l) {
			counted++
		}
	}
	require.Equal(t, 2, counted)
	assert.Equal(t, "github.com/sluice-go/sluice/broker/amqp", p.results[0].pkg)
	assert.Equal(t, "github.com/sluice-go/sluice/router", p.results[1].pkg)
}
