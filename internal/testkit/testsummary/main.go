// Command testsummary turns `go test -json` into what `make test` prints: go test's usual
// terse output (package lines, the output of failed tests), then, at the end of the run, a
// loud list of every test that skipped and why. A test that cannot reach RabbitMQ or Jaeger
// skips on a developer's machine, and a run that skipped half the suite must not read like
// one that tested everything.
//
//	go test -json ./... | testsummary -skips run.jsonl   # prints the run, records its skips
//	testsummary -report run.jsonl                         # the slowest packages and tests, the
//	                                                      # RabbitMQ nodes the tests started (each
//	                                                      # with the version it reported), the skips
//
// With -skips it exits 1 when a test or a build failed.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	skips := flag.String("skips", "", "read `go test -json` on stdin and append its skipped tests to this file")
	report := flag.String("report", "", "print the skipped tests recorded in this file")
	label := flag.String("label", "", "with -skips: end each package's closing line with `label` and record it with the skips")
	flag.Parse()
	switch {
	case *skips != "":
		failed, err := record(os.Stdin, os.Stdout, *skips, *label)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
			os.Exit(2)
		}
		if failed {
			os.Exit(1)
		}
	case *report != "":
		if err := printReport(os.Stderr, *report); err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
			os.Exit(2)
		}
	default:
		flag.Usage()
		os.Exit(2)
	}
}

// entry is one line of the record file: a skip, a node a test started, or a timing.
type entry struct {
	Skip   *Skip   `json:"skip,omitempty"`
	Node   *Node   `json:"node,omitempty"`
	Timing *Timing `json:"timing,omitempty"`
}

// record streams events from r to w as terse text and appends the skips, the nodes the
// tests started and the timings to path.
func record(r io.Reader, w io.Writer, path, label string) (failed bool, err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return false, err
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	s := newStream(w)
	s.label = label
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		for _, sk := range s.line(sc.Bytes()) {
			if err := enc.Encode(entry{Skip: &sk}); err != nil {
				return s.failed, err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return s.failed, err
	}
	for i := range s.nodes {
		if err := enc.Encode(entry{Node: &s.nodes[i]}); err != nil {
			return s.failed, err
		}
	}
	for i := range s.timings {
		if err := enc.Encode(entry{Timing: &s.timings[i]}); err != nil {
			return s.failed, err
		}
	}
	return s.failed, nil
}

func printReport(w io.Writer, path string) error {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	var (
		skips   []Skip
		nodes   []Node
		timings []Timing
	)
	dec := json.NewDecoder(f)
	for dec.More() {
		var e entry
		if err := dec.Decode(&e); err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		switch {
		case e.Skip != nil:
			skips = append(skips, *e.Skip)
		case e.Node != nil:
			nodes = append(nodes, *e.Node)
		case e.Timing != nil:
			timings = append(timings, *e.Timing)
		}
	}
	_, err = io.WriteString(w, TimingReport(timings, 10)+NodesReport(nodes)+Report(skips))
	return err
}
