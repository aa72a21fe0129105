package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const amqpPkg = "github.com/sluice-go/sluice/broker/amqp"

func res(pkg, name string, metrics map[string]float64) result {
	return result{pkg: pkg, name: name, n: 1000, metrics: metrics}
}

func TestGroupRows(t *testing.T) {
	cases := []struct {
		name    string
		results []result
		want    []row
	}{
		{
			name: "sluice beside raw and watermill, ns/op dropped beside a rate",
			results: []result{
				res(amqpPkg, "BenchmarkConfirmedPublish/sluice", map[string]float64{"msgs/s": 8000, "ns/op": 125000, "allocs/op": 60}),
				res(amqpPkg, "BenchmarkConfirmedPublish/raw", map[string]float64{"msgs/s": 10000, "ns/op": 100000, "allocs/op": 30}),
				res(amqpPkg, "BenchmarkConfirmedPublish/watermill", map[string]float64{"msgs/s": 1000, "ns/op": 1e6, "allocs/op": 120}),
			},
			want: []row{
				{benchmark: "broker/amqp ConfirmedPublish", unit: "msgs/s", sluice: "8000", refs: []string{"10000", "1000"}, ratios: []string{"0.80x", "8.00x"}},
				{benchmark: "broker/amqp ConfirmedPublish", unit: "allocs/op", sluice: "60.00", refs: []string{"30.00", "120.0"}, ratios: []string{"2.00x", "0.50x"}},
			},
		},
		{
			name: "a missing reference leaves its cells empty",
			results: []result{
				res("", "BenchmarkRetryPath/raw", map[string]float64{"msgs/s": 500}),
				res("", "BenchmarkRetryPath/sluice", map[string]float64{"msgs/s": 400}),
			},
			want: []row{
				{benchmark: "RetryPath", unit: "msgs/s", sluice: "400.0", refs: []string{"500.0", ""}, ratios: []string{"0.80x", ""}},
			},
		},
		{
			name: "a variant of raw gets rows of its own, beside sluice in the raw column",
			results: []result{
				res("", "BenchmarkRetryPath/sluice", map[string]float64{"msgs/s": 400}),
				res("", "BenchmarkRetryPath/raw", map[string]float64{"msgs/s": 500}),
				res("", "BenchmarkRetryPath/raw-record", map[string]float64{"msgs/s": 450}),
			},
			want: []row{
				{benchmark: "RetryPath", unit: "msgs/s", sluice: "400.0", refs: []string{"500.0", ""}, ratios: []string{"0.80x", ""}},
				{benchmark: "RetryPath vs raw-record", unit: "msgs/s", sluice: "400.0", refs: []string{"450.0", ""}, ratios: []string{"0.89x", ""}},
			},
		},
		{
			name: "a variant of sluice is set beside a variant of raw too",
			results: []result{
				res("", "BenchmarkRetryPath/sluice", map[string]float64{"msgs/s": 400}),
				res("", "BenchmarkRetryPath/sluice-untraced", map[string]float64{"msgs/s": 420}),
				res("", "BenchmarkRetryPath/raw", map[string]float64{"msgs/s": 500}),
				res("", "BenchmarkRetryPath/raw-record", map[string]float64{"msgs/s": 450}),
			},
			want: []row{
				{benchmark: "RetryPath", unit: "msgs/s", sluice: "400.0", refs: []string{"500.0", ""}, ratios: []string{"0.80x", ""}},
				{benchmark: "RetryPath (untraced)", unit: "msgs/s", sluice: "420.0", refs: []string{"500.0", ""}, ratios: []string{"0.84x", ""}},
				{benchmark: "RetryPath vs raw-record", unit: "msgs/s", sluice: "400.0", refs: []string{"450.0", ""}, ratios: []string{"0.89x", ""}},
				{benchmark: "RetryPath (untraced) vs raw-record", unit: "msgs/s", sluice: "420.0", refs: []string{"450.0", ""}, ratios: []string{"0.93x", ""}},
			},
		},
		{
			name: "a variant of raw without a sluice figure stands alone",
			results: []result{
				res("", "BenchmarkV/raw-record", map[string]float64{"msgs/s": 450}),
			},
			want: []row{
				{benchmark: "V/raw-record", unit: "msgs/s", sluice: "450.0", refs: []string{"", ""}, ratios: []string{"", ""}},
			},
		},
		{
			name: "repeated runs give their median, an even count the mean of the middle two",
			results: []result{
				res("", "BenchmarkX/sluice", map[string]float64{"ns/op": 10}),
				res("", "BenchmarkX/watermill", map[string]float64{"ns/op": 40}),
				res("", "BenchmarkX/sluice", map[string]float64{"ns/op": 90}),
				res("", "BenchmarkX/watermill", map[string]float64{"ns/op": 60}),
				res("", "BenchmarkX/sluice", map[string]float64{"ns/op": 30}),
			},
			// The ratio is the median of the paired runs' ratios: 10/40, 90/60, 30/…
			// only two pairs, so (0.25+1.5)/2.
			want: []row{
				{benchmark: "X", unit: "ns/op", sluice: "30.00", refs: []string{"", "50.00"}, ratios: []string{"", "0.88x"}},
			},
		},
		{
			name: "a ratio pairs runs in order, so one slow round does not move it",
			results: []result{
				res("", "BenchmarkR/sluice", map[string]float64{"msgs/s": 100}),
				res("", "BenchmarkR/raw", map[string]float64{"msgs/s": 100}),
				res("", "BenchmarkR/sluice", map[string]float64{"msgs/s": 50}), // a slow minute for both
				res("", "BenchmarkR/raw", map[string]float64{"msgs/s": 50}),
				res("", "BenchmarkR/sluice", map[string]float64{"msgs/s": 90}),
				res("", "BenchmarkR/raw", map[string]float64{"msgs/s": 60}),
			},
			want: []row{
				// Medians alone would give 90/60 = 1.50x; the paired ratios are 1, 1, 1.5.
				{benchmark: "R", unit: "msgs/s", sluice: "90.00", refs: []string{"60.00", ""}, ratios: []string{"1.00x", ""}},
			},
		},
		{
			name: "custom metrics come between rates and go's own, by name",
			results: []result{
				res("", "BenchmarkDelayAccuracy/sluice", map[string]float64{"p99-late-ms": 12, "p50-late-ms": 3, "B/op": 100, "ns/op": 2e6}),
			},
			want: []row{
				{benchmark: "DelayAccuracy", unit: "p50-late-ms", sluice: "3.00", refs: []string{"", ""}, ratios: []string{"", ""}},
				{benchmark: "DelayAccuracy", unit: "p99-late-ms", sluice: "12.00", refs: []string{"", ""}, ratios: []string{"", ""}},
				{benchmark: "DelayAccuracy", unit: "ns/op", sluice: "2000000", refs: []string{"", ""}, ratios: []string{"", ""}},
				{benchmark: "DelayAccuracy", unit: "B/op", sluice: "100.0", refs: []string{"", ""}, ratios: []string{"", ""}},
			},
		},
		{
			name: "go's per-op figures of a one-iteration run are left out",
			results: []result{
				{name: "BenchmarkDelayAccuracy/sluice", n: 1, metrics: map[string]float64{"p50-late-ms": 3, "ns/op": 2e10, "B/op": 7e6, "allocs/op": 1e5}},
			},
			want: []row{
				{benchmark: "DelayAccuracy", unit: "p50-late-ms", sluice: "3.00", refs: []string{"", ""}, ratios: []string{"", ""}},
			},
		},
		{
			name: "a benchmark without sub-benchmarks and other sub names stand alone",
			results: []result{
				res("", "BenchmarkStore", map[string]float64{"ns/op": 0.5}),
				res("", "BenchmarkBegin/hit", map[string]float64{"ns/op": 50}),
				res("", "BenchmarkBegin/miss", map[string]float64{"ns/op": 70}),
			},
			want: []row{
				{benchmark: "Store", unit: "ns/op", sluice: "0.5", refs: []string{"", ""}, ratios: []string{"", ""}},
				{benchmark: "Begin/hit", unit: "ns/op", sluice: "50.00", refs: []string{"", ""}, ratios: []string{"", ""}},
				{benchmark: "Begin/miss", unit: "ns/op", sluice: "70.00", refs: []string{"", ""}, ratios: []string{"", ""}},
			},
		},
		{
			name: "references without a sluice figure are shown on their own",
			results: []result{
				res("", "BenchmarkY/raw", map[string]float64{"msgs/s": 5}),
			},
			want: []row{
				{benchmark: "Y/raw", unit: "msgs/s", sluice: "5.00", refs: []string{"", ""}, ratios: []string{"", ""}},
			},
		},
		{
			name: "the same parent in two packages is two groups",
			results: []result{
				res("github.com/sluice-go/sluice/broker/amqp", "BenchmarkDelayAccuracy/sluice", map[string]float64{"p50-late-ms": 200}),
				res("github.com/sluice-go/sluice/broker/memory", "BenchmarkDelayAccuracy/sluice", map[string]float64{"p50-late-ms": 0.8}),
			},
			want: []row{
				{benchmark: "broker/amqp DelayAccuracy", unit: "p50-late-ms", sluice: "200.0", refs: []string{"", ""}, ratios: []string{"", ""}},
				{benchmark: "broker/memory DelayAccuracy", unit: "p50-late-ms", sluice: "0.8", refs: []string{"", ""}, ratios: []string{"", ""}},
			},
		},
		{
			name: "a zero reference has no ratio",
			results: []result{
				res("", "BenchmarkZ/sluice", map[string]float64{"allocs/op": 3}),
				res("", "BenchmarkZ/raw", map[string]float64{"allocs/op": 0}),
			},
			want: []row{
				{benchmark: "Z", unit: "allocs/op", sluice: "3.00", refs: []string{"0", ""}, ratios: []string{"n/a", ""}},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []row
			for _, g := range groupResults(tc.results) {
				got = append(got, g.rows()...)
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestRender(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, render(&buf, groupResults([]result{
		res(amqpPkg, "BenchmarkConfirmedPublish/sluice", map[string]float64{"msgs/s": 8000}),
		res(amqpPkg, "BenchmarkConfirmedPublish/raw", map[string]float64{"msgs/s": 10000}),
	})))
	lines := strings.Split(buf.String(), "\n")
	require.GreaterOrEqual(t, len(lines), 3)
	assert.Equal(t, "| benchmark                    | metric | sluice | raw amqp091 | watermill | sluice÷raw | sluice÷watermill |", lines[0])
	assert.Equal(t, "| ---------------------------- | ------ | -----: | ----------: | --------: | ---------: | ---------------: |", lines[1])
	assert.Equal(t, "| broker/amqp ConfirmedPublish | msgs/s |   8000 |       10000 |           |      0.80x |                  |", lines[2])

	buf.Reset()
	require.NoError(t, render(&buf, nil))
	assert.Equal(t, "benchtable: no benchmark results\n", buf.String())
}

// run streams the command's output, then appends the table, and returns its status.
func TestRunStreamsOutputAndKeepsStatus(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("needs /bin/sh")
	}
	cases := []struct {
		name   string
		script string
		status int
		table  bool
	}{
		{"success", `echo "pkg: example.com/p"; printf 'BenchmarkA/sluice-2\t10\t5 ns/op\n'`, 0, true},
		{"failure keeps the table of what ran", `printf 'BenchmarkA/sluice-2\t10\t5 ns/op\n'; exit 3`, 3, true},
		{"no results", `echo hello`, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			status := run([]string{"--", "/bin/sh", "-c", tc.script}, strings.NewReader(""), &out, &errOut)
			assert.Equal(t, tc.status, status)
			if tc.table {
				assert.Contains(t, out.String(), "BenchmarkA/sluice-2\t10\t5 ns/op\n", "output is streamed as it is")
				assert.Regexp(t, `\| (example\.com/p )?A +\| ns/op +\| +5\.00 \|`, out.String())
			} else {
				assert.Contains(t, out.String(), "hello\n")
				assert.Contains(t, out.String(), "no benchmark results")
			}
		})
	}
	assert.Equal(t, 2, run(nil, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{}), "no command is a usage error")
	assert.Equal(t, 2, run([]string{"-rounds", "0", "--", "true"}, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{}), "zero rounds is a usage error")
}

// -rounds runs the command again and again; the table takes each figure's median, so one
// slow round does not move it.
func TestRunRoundsTakesTheMedian(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("needs /bin/sh")
	}
	counter := t.TempDir() + "/round"
	// Rounds report 100, 10 and 40 msgs/s for sluice, a constant 50 for raw.
	script := `n=$(cat ` + counter + ` 2>/dev/null || echo 0); n=$((n+1)); echo $n > ` + counter + `
case $n in 1) v=100;; 2) v=10;; *) v=40;; esac
printf 'BenchmarkA/sluice-2\t10\t%s msgs/s\n' $v
printf 'BenchmarkA/raw-2\t10\t50 msgs/s\n'`
	var out bytes.Buffer
	status := run([]string{"-rounds", "3", "--", "/bin/sh", "-c", script}, strings.NewReader(""), &out, &bytes.Buffer{})
	require.Equal(t, 0, status)
	assert.Contains(t, out.String(), "benchtable: round 3 of 3")
	assert.Contains(t, out.String(), "median of 3 rounds")
	assert.Regexp(t, `\| A +\| msgs/s +\| +40\.00 \| +50\.00 \| +\| +0\.80x \|`, out.String())
}

// A variant of sluice (the stack with a default off) is compared with the same references
// of the same rounds, in rows right after sluice's.
func TestGroupRowsSluiceVariant(t *testing.T) {
	var got []row
	for _, g := range groupResults([]result{
		res("", "BenchmarkConsume/sluice", map[string]float64{"msgs/s": 80}),
		res("", "BenchmarkConsume/sluice-nojournal", map[string]float64{"msgs/s": 90}),
		res("", "BenchmarkConsume/raw", map[string]float64{"msgs/s": 100}),
		res("", "BenchmarkConsume/watermill", map[string]float64{"msgs/s": 80}),
	}) {
		got = append(got, g.rows()...)
	}
	assert.Equal(t, []row{
		{benchmark: "Consume", unit: "msgs/s", sluice: "80.00", refs: []string{"100.0", "80.00"}, ratios: []string{"0.80x", "1.00x"}},
		{benchmark: "Consume (nojournal)", unit: "msgs/s", sluice: "90.00", refs: []string{"100.0", "80.00"}, ratios: []string{"0.90x", "1.12x"}},
	}, got)
}

// The summary takes the headline rows, in its own order and with its titles; the rest of
// the table stays out of it.
func TestRenderSummary(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, renderSummary(&buf, groupResults([]result{
		res("github.com/sluice-go/sluice/router", "BenchmarkSlowHandler32/sluice", map[string]float64{"msgs/s": 95}),
		res("github.com/sluice-go/sluice/router", "BenchmarkSlowHandler32/raw", map[string]float64{"msgs/s": 100}),
		res("github.com/sluice-go/sluice/router", "BenchmarkConsume/sluice", map[string]float64{"msgs/s": 80, "allocs/op": 90}),
		res("github.com/sluice-go/sluice/router", "BenchmarkConsume/raw", map[string]float64{"msgs/s": 100}),
		res("github.com/sluice-go/sluice/router", "BenchmarkConsume/watermill", map[string]float64{"msgs/s": 80}),
	})))
	assert.Equal(t, "| what | sluice | raw amqp091 | watermill-amqp | sluice÷raw | sluice÷watermill |\n"+
		"| --- | ---: | ---: | ---: | ---: | ---: |\n"+
		"| consume, handler that does nothing, 8 at a time, prefetch 64 (msgs/s) | 80.00 | 100.0 | 80.00 | 0.80x | 1.00x |\n"+
		"| handler that waits 2 ms, 32 at a time (msgs/s) | 95.00 | 100.0 |  | 0.95x |  |\n", buf.String())

	buf.Reset()
	require.NoError(t, renderSummary(&buf, groupResults([]result{res("", "BenchmarkX/sluice", map[string]float64{"ns/op": 1})})))
	assert.Empty(t, buf.String(), "no headline row, no summary")
}
