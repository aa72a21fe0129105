package sluice_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	// codeSource is the HTML comment that says which compiled Go file a ```go block of the
	// docs shows: <!-- path/to/file.go --> (the whole file) or <!-- excerpt of path/to/file.go -->.
	codeSource = regexp.MustCompile(`^<!--\s*(excerpt of\s+)?(\S+\.go)\s*-->$`)
	// goPackageClause is the package clause of a Go file.
	goPackageClause = regexp.MustCompile(`(?m)^package \w+`)
)

// docGoBlock is a ```go block of a Markdown page.
type docGoBlock struct {
	page    string // the page, from the module root
	line    int    // the line of its opening fence
	source  string // the Go file it is taken from, "" when the page does not say
	excerpt bool   // whether it shows lines of the file rather than all of it
	code    string // its lines, without the fences
}

// Issue 38: "each guide's code is compiled". A snippet a reader copies must compile
// against today's API, so every ```go block in README.md and docs/*.md names the compiled
// Go file it comes from (a program, a test or an Example in a package's _test.go file) and
// is that file, or lines of it in order.
func TestDocsCodeIsCompiled(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	pages = append([]string{"README.md"}, pages...)

	var blocks []docGoBlock
	for _, page := range pages {
		b, err := os.ReadFile(page)
		require.NoError(t, err)
		blocks = append(blocks, goBlocks(page, string(b))...)
	}
	require.NotEmpty(t, blocks, "the docs show Go code")

	for _, blk := range blocks {
		t.Run(blk.page+":"+strconv.Itoa(blk.line), func(t *testing.T) {
			require.NotEmpty(t, blk.source, "%s:%d: a ```go block must follow <!-- path/to/file.go --> or <!-- excerpt of path/to/file.go -->, naming the compiled file it shows", blk.page, blk.line)
			src, err := os.ReadFile(blk.source)
			require.NoError(t, err, "%s:%d names %s", blk.page, blk.line, blk.source)
			requireCompiled(t, blk.source, string(src))
			if !blk.excerpt {
				assert.Equal(t, string(src), blk.code, "%s:%d differs from %s: copy the file into the block", blk.page, blk.line, blk.source)
				return
			}
			missing, ok := excerptOf(blk.code, string(src))
			assert.True(t, ok, "%s:%d is not an excerpt of %s: %q is not there (after the lines before it); change the file's code and the block together", blk.page, blk.line, blk.source, missing)
		})
	}
}

// The excerpt check itself: lines in order, whitespace aside, "// ..." for what is left out.
func TestDocsExcerptOf(t *testing.T) {
	const file = "func f() {\n\ta := 1\n\tb := 2   // two\n\treturn\n}\n"
	for _, tc := range []struct {
		name, excerpt string
		ok            bool
	}{
		{"consecutive", "func f() {\n\ta := 1\n", true},
		{"with a gap", "a := 1\n\n// ...\nreturn\n", true},
		{"spaces differ", "b := 2 // two\n", true},
		{"out of order", "return\na := 1\n", false},
		{"not in the file", "c := 3\n", false},
		{"a line used twice", "a := 1\na := 1\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ok := excerptOf(tc.excerpt, file)
			assert.Equal(t, tc.ok, ok)
		})
	}
}

// goBlocks returns the ```go blocks of a page, each with the source comment before it.
func goBlocks(page, text string) []docGoBlock {
	lines := strings.Split(text, "\n")
	var blocks []docGoBlock
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(trimmed, "```") {
			continue
		}
		lang := strings.TrimPrefix(trimmed, "```")
		end := i + 1
		for end < len(lines) && strings.TrimSpace(lines[end]) != "```" {
			end++
		}
		if lang == "go" {
			blk := docGoBlock{page: page, line: i + 1, code: strings.Join(lines[i+1:min(end, len(lines))], "\n") + "\n"}
			for j := i - 1; j >= 0; j-- {
				prev := strings.TrimSpace(lines[j])
				if prev == "" {
					continue
				}
				if m := codeSource.FindStringSubmatch(prev); m != nil {
					blk.excerpt, blk.source = m[1] != "", filepath.FromSlash(m[2])
				}
				break
			}
			blocks = append(blocks, blk)
		}
		i = end
	}
	return blocks
}

// requireCompiled fails unless path is a Go file the module builds or tests: not under
// testdata, not excluded with a build constraint that turns it off.
func requireCompiled(t *testing.T, path, src string) {
	t.Helper()
	for _, dir := range strings.Split(filepath.ToSlash(path), "/") {
		require.NotEqual(t, "testdata", dir, "%s is under testdata, which go build and go test skip", path)
	}
	for _, line := range strings.Split(src, "\n") {
		if strings.HasPrefix(line, "package ") {
			break
		}
		require.NotEqual(t, "//go:build ignore", strings.TrimSpace(line), "%s is excluded from the build", path)
	}
	require.True(t, goPackageClause.MatchString(src), "%s has no package clause", path)
}

// excerptOf reports whether every non-blank line of excerpt is a line of src, in order
// (whitespace runs compared as one space, so gofmt's alignment does not matter); a line
// "// ..." stands for code left out. It returns the first line it could not place.
func excerptOf(excerpt, src string) (string, bool) {
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	srcLines := strings.Split(src, "\n")
	at := 0
	for _, line := range strings.Split(excerpt, "\n") {
		want := norm(line)
		if want == "" || want == "// ..." {
			continue
		}
		for at < len(srcLines) && norm(srcLines[at]) != want {
			at++
		}
		if at == len(srcLines) {
			return line, false
		}
		at++
	}
	return "", true
}
