//go:build soak

package soak

import (
	"bytes"
	"fmt"
	"os"
	"strings"
)

// row is one series of the table with its verdict.
type row struct {
	name    string
	bytes   bool // shown in MiB rather than as a count
	bound   Bound
	verdict Verdict
	// missing says why the series was not sampled; empty when it was.
	missing string
}

// format shows a figure of r in its unit.
func (r row) format(v float64) string {
	if r.bytes {
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	}
	return fmt.Sprintf("%.0f", v)
}

// formatSigned shows a growth of r, with its sign.
func (r row) formatSigned(v float64) string {
	if r.bytes {
		return fmt.Sprintf("%+.1f MiB", v/(1<<20))
	}
	return fmt.Sprintf("%+.1f", v)
}

// boundText states r's bound in words.
func (r row) boundText() string {
	switch {
	case r.bound.Rel == 0:
		return r.format(r.bound.Abs)
	case r.bytes:
		return fmt.Sprintf("%.0f%% + %.0f MiB", 100*r.bound.Rel, r.bound.Abs/(1<<20))
	default:
		return fmt.Sprintf("%.0f%% + %.0f", 100*r.bound.Rel, r.bound.Abs)
	}
}

// table renders rows as Markdown: metric | start | peak | end | fitted growth after the
// warm-up | allowed (the bound and what it came to) | verdict.
func table(rows []row) string {
	var b strings.Builder
	b.WriteString("| metric | start | peak | end | growth after warm-up (fitted) | allowed | verdict |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range rows {
		if r.missing != "" {
			fmt.Fprintf(&b, "| %s | – | – | – | – | – | not sampled: %s |\n", r.name, r.missing)
			continue
		}
		v := r.verdict
		verdict := "flat"
		switch {
		case v.Judged < minJudged:
			verdict = "not judged (run too short)"
		case v.Leak:
			verdict = "**GROWING**"
		case v.Growth > v.Allowed:
			verdict = "flat (a rise that fell back)"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s (%s) | %s |\n", r.name, r.format(v.Start), r.format(v.Peak), r.format(v.End),
			r.formatSigned(v.Growth), r.format(v.Allowed), r.boundText(), verdict)
	}
	return b.String()
}

// soakHeading is the heading of BENCHMARKS.md's section the soak owns.
const soakHeading = "## Soak"

// spliceSection returns doc with its "## Soak" section (from the heading to the next
// second-level heading, or the end) replaced by section, which starts with the heading.
// Without one, section goes before "## Latest generated tables", which stays last
// because make bench-record writes there, or at the end. Every other byte is kept.
func spliceSection(doc []byte, section string) []byte {
	section = strings.TrimRight(section, "\n") + "\n"
	start := headingAt(doc, soakHeading)
	if start < 0 {
		at := headingAt(doc, "## Latest generated tables")
		if at < 0 {
			out := append([]byte{}, bytes.TrimRight(doc, "\n")...)
			return append(append(out, "\n\n"...), section...)
		}
		return append(append(append([]byte{}, doc[:at]...), (section+"\n")...), doc[at:]...)
	}
	end := len(doc)
	if next := headingAt(doc[start+len(soakHeading):], "## "); next >= 0 {
		end = start + len(soakHeading) + next
		section += "\n"
	}
	return append(append(append([]byte{}, doc[:start]...), section...), doc[end:]...)
}

// headingAt returns the offset of the first line of doc that starts with prefix (and, for
// a full heading, is exactly it or continues with a space), or -1.
func headingAt(doc []byte, prefix string) int {
	for off := 0; off < len(doc); {
		line := doc[off:]
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			line = line[:i]
		}
		if bytes.HasPrefix(line, []byte(prefix)) {
			rest := line[len(prefix):]
			if strings.HasSuffix(prefix, " ") || len(rest) == 0 || rest[0] == ' ' {
				return off
			}
		}
		off += len(line) + 1
	}
	return -1
}

// recordSection writes section into the file at path (spliceSection).
func recordSection(path, section string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("record the soak table: %w", err)
	}
	if err := os.WriteFile(path, spliceSection(doc, section), 0o644); err != nil {
		return fmt.Errorf("record the soak table in %s: %w", path, err)
	}
	return nil
}
