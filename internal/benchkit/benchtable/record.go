package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

// The markers between which -record writes the table: BENCHMARKS.md's "Latest generated
// table" section. Everything outside them is the file's own text and is kept.
const (
	recordBegin = "<!-- benchtable:begin -->"
	recordEnd   = "<!-- benchtable:end -->"
)

// errNoMarkers is returned when the file to record into lacks the markers, in order.
var errNoMarkers = errors.New("benchtable markers not found in order")

// markers returns the markers of section: the plain ones for "", else each with the
// section's name ("<!-- benchtable:begin RabbitMQ 4.3 -->"), one table per broker version.
func markers(section string) (begin, end string) {
	if section == "" {
		return recordBegin, recordEnd
	}
	return strings.TrimSuffix(recordBegin, " -->") + " " + section + " -->", strings.TrimSuffix(recordEnd, " -->") + " " + section + " -->"
}

// summarySection names the markers of section's summary ("summary RabbitMQ 4.3").
func summarySection(section string) string { return "summary " + section }

// record replaces the text between section's markers in the file at path with table,
// headed by when, where and against which broker it was measured.
func record(path, section, broker string, table []byte, rounds int, now time.Time) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("record the table: %w", err)
	}
	out, err := spliceTable(doc, section, broker, table, rounds, now)
	if err != nil {
		return fmt.Errorf("record the table in %s: %w", path, err)
	}
	return os.WriteFile(path, out, 0o644)
}

// spliceTable returns doc with the text between the markers replaced by table.
func spliceTable(doc []byte, section, broker string, table []byte, rounds int, now time.Time) ([]byte, error) {
	mb, me := markers(section)
	begin := bytes.Index(doc, []byte(mb))
	if begin < 0 {
		return nil, fmt.Errorf("%w: %s", errNoMarkers, mb)
	}
	begin += len(mb)
	end := bytes.Index(doc[begin:], []byte(me))
	if end < 0 {
		return nil, fmt.Errorf("%w: %s after %s", errNoMarkers, me, mb)
	}
	end += begin
	var b bytes.Buffer
	b.Write(doc[:begin])
	fmt.Fprintf(&b, "\nMeasured %s against %s with %s on %s/%s, %d CPUs; each figure the median of %d round(s).\n\n",
		now.UTC().Format("2006-01-02 15:04 UTC"), broker, runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), rounds)
	b.Write(bytes.TrimSpace(table))
	b.WriteString("\n")
	b.Write(doc[end:])
	return b.Bytes(), nil
}
