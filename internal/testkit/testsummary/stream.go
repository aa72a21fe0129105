package main

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json), build events included.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

// Node is a RabbitMQ node a test started, with the version it reported.
type Node struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Package string `json:"package"`
	Label   string `json:"label,omitempty"`
}

// startedNode matches the line testenv (and the node scripts) print for every node they
// start: "started RabbitMQ 4.3.6 node sluice_123456@host".
var startedNode = regexp.MustCompile(`started RabbitMQ (\S+) node (\S+@\S+)`)

// Timing is how long one test or package took.
type Timing struct {
	Package string  `json:"package"`
	Test    string  `json:"test,omitempty"`
	Seconds float64 `json:"seconds"`
	Label   string  `json:"label,omitempty"`
}

// slowTest is the least a top-level test takes to be recorded as slow.
const slowTest = 5.0

// Skip is one skipped test and the reason it gave.
type Skip struct {
	Package string `json:"package"`
	Test    string `json:"test"`
	Reason  string `json:"reason"`
	// Label names the run the test skipped in ("RabbitMQ 4.3"), when the run had one.
	Label string `json:"label,omitempty"`
}

// stream prints a run as go test prints it without -v, and collects its skips.
type stream struct {
	w       io.Writer
	outputs map[string][]string // package + test -> output lines
	failed  bool
	// label, when set, ends every package's closing line and labels its skips.
	label string
	// nodes are the RabbitMQ nodes the tests said they started; timings the packages and
	// the slow top-level tests, in the order they ended.
	nodes   []Node
	timings []Timing
}

func newStream(w io.Writer) *stream { return &stream{w: w, outputs: map[string][]string{}} }

// line handles one line of go test -json and returns the skips it completed. A line that
// is not JSON (go vet's or the linker's own output) is printed as it is.
func (s *stream) line(b []byte) []Skip {
	var ev event
	if err := json.Unmarshal(b, &ev); err != nil || ev.Action == "" {
		fmt.Fprintln(s.w, string(b))
		return nil
	}
	key := ev.Package + "\x00" + ev.Test
	if ev.Action == "output" {
		if m := startedNode.FindStringSubmatch(ev.Output); m != nil {
			s.nodes = append(s.nodes, Node{Name: m[2], Version: m[1], Package: ev.Package, Label: s.label})
		}
	}
	if (ev.Action == "pass" || ev.Action == "fail") && (ev.Test == "" || (!strings.Contains(ev.Test, "/") && ev.Elapsed >= slowTest)) {
		s.timings = append(s.timings, Timing{Package: ev.Package, Test: ev.Test, Seconds: ev.Elapsed, Label: s.label})
	}
	switch {
	case ev.Action == "build-output":
		fmt.Fprint(s.w, ev.Output)
	case ev.Action == "build-fail":
		s.failed = true
	case ev.Test == "":
		if ev.Action == "fail" {
			s.failed = true
		}
		if ev.Action == "output" && ev.Output != "PASS\n" && !strings.HasPrefix(ev.Output, "=== ") {
			fmt.Fprint(s.w, s.labelled(ev.Output))
		}
	case ev.Action == "output":
		s.outputs[key] = append(s.outputs[key], ev.Output)
	case ev.Action == "fail":
		s.failed = true
		for _, l := range s.outputs[key] {
			if !strings.HasPrefix(l, "=== ") {
				fmt.Fprint(s.w, l)
			}
		}
		delete(s.outputs, key)
	case ev.Action == "skip":
		reason := skipReason(s.outputs[key])
		delete(s.outputs, key)
		return []Skip{{Package: ev.Package, Test: ev.Test, Reason: reason, Label: s.label}}
	case ev.Action == "pass":
		delete(s.outputs, key)
	}
	return nil
}

// labelled returns a package's closing line (ok, FAIL, no test files) with the run's
// label at its end, and any other line as it is.
func (s *stream) labelled(line string) string {
	if s.label == "" {
		return line
	}
	for _, p := range []string{"ok  \t", "FAIL\t", "?   \t"} {
		if strings.HasPrefix(line, p) {
			return strings.TrimSuffix(line, "\n") + "\t[" + s.label + "]\n"
		}
	}
	return line
}

// skipReason is what a skipped test logged, without go test's headers and file:line
// prefixes: "RabbitMQ is not reachable at ...".
func skipReason(lines []string) string {
	var parts []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		if file, msg, ok := strings.Cut(l, ": "); ok && strings.Contains(file, ".go:") && !strings.Contains(file, " ") {
			l = msg
		}
		parts = append(parts, l)
	}
	if len(parts) == 0 {
		return "no reason given"
	}
	return strings.Join(parts, " ")
}

// Report is the loud summary of skips, grouped by reason, or "" when nothing skipped.
func Report(skips []Skip) string {
	if len(skips) == 0 {
		return ""
	}
	byReason := map[string][]Skip{}
	for _, sk := range skips {
		byReason[sk.Reason] = append(byReason[sk.Reason], sk)
	}
	reasons := make([]string, 0, len(byReason))
	for r := range byReason {
		reasons = append(reasons, r)
	}
	// The reason that skipped most first: usually the missing broker.
	sort.Slice(reasons, func(i, j int) bool {
		if a, b := len(byReason[reasons[i]]), len(byReason[reasons[j]]); a != b {
			return a > b
		}
		return reasons[i] < reasons[j]
	})
	var b strings.Builder
	rule := strings.Repeat("=", 78)
	fmt.Fprintf(&b, "\n%s\n", rule)
	fmt.Fprintf(&b, "SKIPPED: %d tests did not run, so this run did NOT test everything.\n", len(skips))
	for _, r := range reasons {
		group := byReason[r]
		fmt.Fprintf(&b, "\n%d skipped: %s\n", len(group), r)
		byPkg := map[string][]string{}
		var pkgs []string
		for _, sk := range group {
			pkg := sk.Package
			if sk.Label != "" {
				pkg += " [" + sk.Label + "]"
			}
			if _, ok := byPkg[pkg]; !ok {
				pkgs = append(pkgs, pkg)
			}
			byPkg[pkg] = append(byPkg[pkg], sk.Test)
		}
		sort.Strings(pkgs)
		for _, p := range pkgs {
			fmt.Fprintf(&b, "  %s: %s\n", p, strings.Join(byPkg[p], ", "))
		}
	}
	fmt.Fprintf(&b, "\nmake test starts what they need when it can install and run it (see the top of its\n")
	fmt.Fprintf(&b, "output for what it could not); go test alone needs them running (CONTRIBUTING.md).\n")
	fmt.Fprintf(&b, "SLUICE_REQUIRE_BROKER=1 and SLUICE_REQUIRE_JAEGER=1 (set by .ci/run) make these tests\n")
	fmt.Fprintf(&b, "fail instead of skipping.\n%s\n", rule)
	return b.String()
}

// NodesReport says which RabbitMQ versions the nodes the tests started reported, per run
// label, or "" when the tests started none.
func NodesReport(nodes []Node) string {
	if len(nodes) == 0 {
		return ""
	}
	type key struct{ label, version string }
	count := map[key]int{}
	var keys []key
	for _, n := range nodes {
		k := key{n.Label, n.Version}
		if count[k] == 0 {
			keys = append(keys, k)
		}
		count[k]++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nRabbitMQ nodes the tests started, as each reported its version (in run order):\n")
	for _, k := range keys {
		label := ""
		if k.label != "" {
			label = " [" + k.label + "]"
		}
		fmt.Fprintf(&b, "  %3d node(s) RabbitMQ %s%s\n", count[k], k.version, label)
	}
	return b.String()
}

// TimingReport lists the slowest packages and top-level tests, at most n of each.
func TimingReport(timings []Timing, n int) string {
	var pkgs, tests []Timing
	for _, t := range timings {
		if t.Test == "" {
			pkgs = append(pkgs, t)
		} else {
			tests = append(tests, t)
		}
	}
	if len(pkgs) == 0 && len(tests) == 0 {
		return ""
	}
	var b strings.Builder
	list := func(title string, ts []Timing) {
		if len(ts) == 0 {
			return
		}
		sort.SliceStable(ts, func(i, j int) bool { return ts[i].Seconds > ts[j].Seconds })
		if len(ts) > n {
			ts = ts[:n]
		}
		fmt.Fprintf(&b, "\n%s:\n", title)
		for _, t := range ts {
			name := t.Package
			if t.Test != "" {
				name += " " + t.Test
			}
			if t.Label != "" {
				name += " [" + t.Label + "]"
			}
			fmt.Fprintf(&b, "  %7.1f s  %s\n", t.Seconds, name)
		}
	}
	list("slowest packages (each package's tests run in one process; packages run side by side)", pkgs)
	list("slowest tests", tests)
	return b.String()
}
