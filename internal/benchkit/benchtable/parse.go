package main

import (
	"strconv"
	"strings"
)

// result is one benchmark line of `go test -bench` output.
type result struct {
	// pkg is the import path of the package the benchmark ran in (the last "pkg:" line).
	pkg string
	// name is the benchmark's name without the -GOMAXPROCS suffix.
	name string
	// n is the iteration count.
	n int
	// metrics maps a unit (ns/op, B/op, allocs/op, msgs/s, ...) to its value.
	metrics map[string]float64
}

// parser reads `go test -bench` output line by line.
type parser struct {
	pkg     string
	results []result
	// pending is the name of a benchmark whose line held no figures: a benchmark that logs
	// writes its lines between its name and its figures, which follow on a line of their own.
	pending string
}

// line consumes one line of output and reports whether it was a benchmark result.
func (p *parser) line(s string) bool {
	s = strings.TrimRight(s, "\r\n")
	if rest, ok := strings.CutPrefix(s, "pkg: "); ok {
		p.pkg = strings.TrimSpace(rest)
		return false
	}
	r, ok := parseResult(s)
	if !ok && p.pending != "" {
		// The figures of a benchmark whose name a log line interrupted.
		r, ok = parseResult(p.pending + " " + s)
	}
	if !ok {
		if f := strings.Fields(s); len(f) > 0 && strings.HasPrefix(f[0], "Benchmark") {
			p.pending = f[0]
		}
		return false
	}
	p.pending = ""
	r.pkg = p.pkg
	p.results = append(p.results, r)
	return true
}

// parseResult parses "BenchmarkName-2   1000   1234 ns/op   56.7 msgs/s ..." A line that
// has a name and an iteration count but not a single value-unit pair (a benchmark that
// printed output, which puts its name on a line of its own) is not a result.
func parseResult(s string) (result, bool) {
	fields := strings.Fields(s)
	if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") || len(fields)%2 != 0 {
		return result{}, false
	}
	n, err := strconv.Atoi(fields[1])
	if err != nil || n <= 0 {
		return result{}, false
	}
	r := result{name: trimProcs(fields[0]), n: n, metrics: make(map[string]float64, (len(fields)-2)/2)}
	for i := 2; i+1 < len(fields); i += 2 {
		v, err := strconv.ParseFloat(fields[i], 64)
		if err != nil {
			return result{}, false
		}
		r.metrics[fields[i+1]] = v
	}
	return r, true
}

// trimProcs removes the "-N" GOMAXPROCS suffix go test appends to a benchmark's name.
func trimProcs(name string) string {
	i := strings.LastIndexByte(name, '-')
	if i < 0 || i == len(name)-1 {
		return name
	}
	if _, err := strconv.Atoi(name[i+1:]); err != nil {
		return name
	}
	return name[:i]
}
