package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json), build events included.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

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
	fmt.Fprintf(&b, "\nStart what they need (RabbitMQ: rabbitmq-server -detached, or docker compose up -d\n")
	fmt.Fprintf(&b, "rabbitmq) and run make test again. SLUICE_REQUIRE_BROKER=1 and SLUICE_REQUIRE_JAEGER=1\n")
	fmt.Fprintf(&b, "(set by .ci/run) make these tests fail instead of skipping.\n%s\n", rule)
	return b.String()
}
