// Command testsummary turns `go test -json` into what `make test` prints: go test's usual
// terse output (package lines, the output of failed tests), then, at the end of the run, a
// loud list of every test that skipped and why. A test that cannot reach RabbitMQ or Jaeger
// skips on a developer's machine, and a run that skipped half the suite must not read like
// one that tested everything.
//
//	go test -json ./... | testsummary -skips skips.jsonl   # prints the run, records its skips
//	testsummary -report skips.jsonl                         # prints the skips of every run
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

// record streams events from r to w as terse text and appends the skips to path.
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
			if err := enc.Encode(sk); err != nil {
				return s.failed, err
			}
		}
	}
	return s.failed, sc.Err()
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
	var skips []Skip
	dec := json.NewDecoder(f)
	for dec.More() {
		var sk Skip
		if err := dec.Decode(&sk); err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		skips = append(skips, sk)
	}
	_, err = io.WriteString(w, Report(skips))
	return err
}
