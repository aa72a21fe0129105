package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"
)

// The markers between which -record writes the table: BENCHMARKS.md's "Latest generated
// table" section. Everything outside them is the file's own text and is kept.
const (
	recordBegin = "<!-- benchtable:begin -->"
	recordEnd   = "<!-- benchtable:end -->"
)

// errNoMarkers is returned when the file to record into lacks the markers, in order.
var errNoMarkers = errors.New("markers " + recordBegin + " and " + recordEnd + " not found in order")

// record replaces the text between the markers in the file at path with table, headed by
// when and where it was measured.
func record(path string, table []byte, rounds int, now time.Time) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("record the table: %w", err)
	}
	out, err := spliceTable(doc, table, rounds, now)
	if err != nil {
		return fmt.Errorf("record the table in %s: %w", path, err)
	}
	return os.WriteFile(path, out, 0o644)
}

// spliceTable returns doc with the text between the markers replaced by table.
func spliceTable(doc, table []byte, rounds int, now time.Time) ([]byte, error) {
	begin := bytes.Index(doc, []byte(recordBegin))
	if begin < 0 {
		return nil, errNoMarkers
	}
	begin += len(recordBegin)
	end := bytes.Index(doc[begin:], []byte(recordEnd))
	if end < 0 {
		return nil, errNoMarkers
	}
	end += begin
	var b bytes.Buffer
	b.Write(doc[:begin])
	fmt.Fprintf(&b, "\nMeasured %s with %s on %s/%s, %d CPUs; each figure the median of %d round(s).\n\n",
		now.UTC().Format("2006-01-02 15:04 UTC"), runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), rounds)
	b.Write(bytes.TrimSpace(table))
	b.WriteString("\n")
	b.Write(doc[end:])
	return b.Bytes(), nil
}
