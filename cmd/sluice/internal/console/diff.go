package console

import "strings"

// DiffLine is one line of a line diff: Op is ' ' (in both), '-' (only in the old text) or
// '+' (only in the new one); Old and New number it in each text (0 when not in it). A
// run of unchanged lines is collapsed into one line with Skipped set.
type DiffLine struct {
	Op       string
	Text     string
	Old, New int
	// Skipped, when not zero, is how many unchanged lines this line stands for.
	Skipped int
}

// Diff bounds: the longest-common-subsequence table is (n+1)×(m+1) cells of the changed
// middle, so a larger middle is shown as removed then added, not diffed.
const (
	maxDiffCells = 4_000_000
	diffContext  = 3
)

// lineDiff returns the line diff of old and new: the common head and tail, and a longest
// common subsequence diff of the middle (see maxDiffCells), unchanged runs longer than
// twice diffContext collapsed.
func lineDiff(old, new string) []DiffLine {
	a, b := splitLines(old), splitLines(new)
	head := 0
	for head < len(a) && head < len(b) && a[head] == b[head] {
		head++
	}
	tail := 0
	for tail < len(a)-head && tail < len(b)-head && a[len(a)-1-tail] == b[len(b)-1-tail] {
		tail++
	}
	var out []DiffLine
	for i := range head {
		out = append(out, DiffLine{Op: " ", Text: a[i], Old: i + 1, New: i + 1})
	}
	out = append(out, diffMiddle(a[head:len(a)-tail], b[head:len(b)-tail], head)...)
	for k := range tail {
		i, j := len(a)-tail+k, len(b)-tail+k
		out = append(out, DiffLine{Op: " ", Text: a[i], Old: i + 1, New: j + 1})
	}
	return collapse(out)
}

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

// diffMiddle diffs a and b, whose lines are numbered from off+1.
func diffMiddle(a, b []string, off int) []DiffLine {
	n, m := len(a), len(b)
	var out []DiffLine
	if n*m > maxDiffCells {
		for i, l := range a {
			out = append(out, DiffLine{Op: "-", Text: l, Old: off + i + 1})
		}
		for j, l := range b {
			out = append(out, DiffLine{Op: "+", Text: l, New: off + j + 1})
		}
		return out
	}
	// lcs[i][j] is the LCS length of a[i:] and b[j:].
	lcs := make([][]int32, n+1)
	for i := range lcs {
		lcs[i] = make([]int32, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			out = append(out, DiffLine{Op: " ", Text: a[i], Old: off + i + 1, New: off + j + 1})
			i++
			j++
		case i < n && (j == m || lcs[i+1][j] >= lcs[i][j+1]):
			out = append(out, DiffLine{Op: "-", Text: a[i], Old: off + i + 1})
			i++
		default:
			out = append(out, DiffLine{Op: "+", Text: b[j], New: off + j + 1})
			j++
		}
	}
	return out
}

// collapse replaces the inside of every unchanged run longer than 2*diffContext+1 lines
// with one Skipped line, keeping diffContext lines around each change.
func collapse(lines []DiffLine) []DiffLine {
	if removed, added := diffStats(lines); removed+added == 0 {
		return lines
	}
	var out []DiffLine
	for i := 0; i < len(lines); {
		if lines[i].Op != " " {
			out = append(out, lines[i])
			i++
			continue
		}
		j := i
		for j < len(lines) && lines[j].Op == " " {
			j++
		}
		run := lines[i:j]
		keepHead, keepTail := diffContext, diffContext
		if i == 0 {
			keepHead = 0
		}
		if j == len(lines) {
			keepTail = 0
		}
		if len(run) > keepHead+keepTail+1 {
			out = append(out, run[:keepHead]...)
			out = append(out, DiffLine{Op: " ", Skipped: len(run) - keepHead - keepTail})
			out = append(out, run[len(run)-keepTail:]...)
		} else {
			out = append(out, run...)
		}
		i = j
	}
	return out
}

// diffStats counts the removed and added lines of d.
func diffStats(d []DiffLine) (removed, added int) {
	for _, l := range d {
		switch l.Op {
		case "-":
			removed++
		case "+":
			added++
		}
	}
	return removed, added
}
