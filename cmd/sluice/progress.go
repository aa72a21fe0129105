package main

import (
	"fmt"
	"io"
	"os"

	"github.com/sluice-go/sluice/dlq"
)

// progressLine shows the progress of a long operation on one line of a terminal; when
// stderr is not a terminal (a pipe, a log file, a test) it shows nothing.
type progressLine struct {
	w     io.Writer
	shown bool
}

func newProgressLine(e *env) *progressLine {
	f, ok := e.stderr.(*os.File)
	if !ok {
		return &progressLine{}
	}
	if fi, err := f.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return &progressLine{}
	}
	return &progressLine{w: f}
}

// report is a dlq Progress callback.
func (l *progressLine) report(p dlq.Progress) {
	if l.w == nil {
		return
	}
	rate := 0.0
	if s := p.Elapsed.Seconds(); s > 0 {
		rate = float64(p.Scanned) / s
	}
	line := fmt.Sprintf("%s %s: %d/%d read", p.Op, p.Queue, p.Scanned, p.Total)
	if p.Op != "read" {
		line += fmt.Sprintf(", %d selected, %d %s", p.Matched, p.Moved, pastTense[p.Op])
	}
	line += fmt.Sprintf(" (%.0f msg/s)", rate)
	fmt.Fprintf(l.w, "\r\033[K%s", line)
	l.shown = true
}

// end ends the line, if one was shown.
func (l *progressLine) end() {
	if l.shown {
		fmt.Fprintln(l.w)
	}
}
