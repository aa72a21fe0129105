package sluice_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	// markdownLink is a link target in Markdown: [text](target).
	markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// docMention is a Markdown file named in prose or a comment, with or without a directory.
	docMention = regexp.MustCompile(`[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b`)
	// markdownHeading is an ATX heading: its text, without the closing hashes.
	markdownHeading = regexp.MustCompile(`^#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$`)
	// htmlAnchor is an anchor written in HTML: <a name="x"> or id="x".
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	// inlineLink is a link inside a heading, whose text alone makes the anchor.
	inlineLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// readmeMaxLines is how long README.md may be: what sluice is, install, the quickstart and
// a map of the guides under docs/. Everything else belongs in a guide (issue 38).
const readmeMaxLines = 250

// repositoryFiles walks the repository and returns its Markdown and Go files, and the base
// names of every file.
func repositoryFiles(t *testing.T) (files []string, basenames map[string]bool) {
	t.Helper()
	basenames = map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "node_modules", ".cache", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		basenames[d.Name()] = true
		if ext := filepath.Ext(path); ext == ".md" || ext == ".go" {
			files = append(files, path)
		}
		return nil
	})
	require.NoError(t, err)
	require.Contains(t, files, "README.md")
	return files, basenames
}

// Issue 17: godoc pointed at a DESIGN.md the repository did not hold. Every relative
// Markdown link, and every .md file a Go comment or a Markdown page names, must exist.
func TestNoReferenceToAMissingFile(t *testing.T) {
	files, basenames := repositoryFiles(t)
	exists := func(from, target string) bool {
		for _, p := range []string{filepath.Join(filepath.Dir(from), target), target} {
			if _, err := os.Stat(p); err == nil {
				return true
			}
		}
		return false
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		text := string(b)
		if strings.HasSuffix(f, ".go") {
			text = goComments(text)
		}
		if strings.HasSuffix(f, ".md") {
			for _, m := range markdownLink.FindAllStringSubmatch(text, -1) {
				target, _, _ := strings.Cut(m[1], "#")
				if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				assert.True(t, exists(f, target), "%s links to %s, which the repository does not hold", f, m[1])
			}
		}
		for _, name := range docMention.FindAllString(text, -1) {
			if strings.Contains(name, "/") {
				if strings.Contains(name, "//") || strings.HasPrefix(name, "github.com/") {
					continue // a URL's path, not a file of this repository
				}
				assert.True(t, exists(f, name), "%s names %s, which the repository does not hold", f, name)
				continue
			}
			assert.True(t, basenames[name], "%s names %s, which the repository does not hold", f, name)
		}
	}
}

// Issue 38: the README's sections moved into guides under docs/, and links such as
// README.md#rabbitmq-versions-310-40-43 would have kept working as file links while leading
// nowhere. Every link with a #fragment to a Markdown file of the repository (or to the
// page itself) must name a heading of that file, as GitHub makes its anchors.
func TestNoReferenceToAMissingAnchor(t *testing.T) {
	files, _ := repositoryFiles(t)
	anchors := map[string]map[string]bool{} // cleaned path → anchors
	anchorsOf := func(path string) map[string]bool {
		path = filepath.Clean(path)
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		anchors[path] = markdownAnchors(string(b))
		return anchors[path]
	}
	for _, f := range files {
		if !strings.HasSuffix(f, ".md") {
			continue
		}
		t.Run(f, func(t *testing.T) {
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			for _, m := range markdownLink.FindAllStringSubmatch(proseOnly(string(b)), -1) {
				target, fragment, ok := strings.Cut(m[1], "#")
				if !ok || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path := f
				if target != "" {
					if !strings.HasSuffix(target, ".md") {
						continue // a fragment of a source file (#L10) or a page GitHub renders otherwise
					}
					path = filepath.Join(filepath.Dir(f), target)
					if _, err := os.Stat(path); err != nil {
						continue // TestNoReferenceToAMissingFile reports it
					}
				}
				assert.True(t, anchorsOf(path)[fragment], "%s links to %s, but %s has no heading whose anchor is #%s", f, m[1], filepath.Clean(path), fragment)
			}
		})
	}
}

// TestDocsHeadingSlug pins the anchors GitHub gives headings, which the links depend on.
func TestDocsHeadingSlug(t *testing.T) {
	for _, tc := range []struct {
		heading string
		want    string
	}{
		{"Install", "install"},
		{"RabbitMQ versions: 3.10, 4.0, 4.3", "rabbitmq-versions-310-40-43"},
		{"Overload: pause, retry budget, adaptive retries", "overload-pause-retry-budget-adaptive-retries"},
		{"Publish/subscribe", "publishsubscribe"},
		{"HandlerTimeout and consumer_timeout", "handlertimeout-and-consumer_timeout"},
		{"Dead-letter operations (`BenchmarkDLQ`, issue 19)", "dead-letter-operations-benchmarkdlq-issue-19"},
		{"What a handler's return means", "what-a-handlers-return-means"},
		{"Idempotency, honestly", "idempotency-honestly"},
		{"[0.2.0] - Unreleased", "020---unreleased"},
		{"Links to [the guide](docs/x.md)", "links-to-the-guide"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			assert.Equal(t, tc.want, headingSlug(tc.heading))
		})
	}
	t.Run("duplicates are numbered", func(t *testing.T) {
		got := markdownAnchors("# Quiet rounds\n\n## Quiet rounds\n\n```sh\n# not a heading\n```\n\n### Quiet rounds\n")
		assert.Equal(t, map[string]bool{"quiet-rounds": true, "quiet-rounds-1": true, "quiet-rounds-2": true}, got)
	})
}

// Issue 38: the README was 1,635 lines with about 40 headings, and a newcomer could not
// find the quickstart in it. It stays short; the rest is in docs/.
func TestREADMEFitsOnAFewScreens(t *testing.T) {
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	lines := strings.Count(string(b), "\n")
	if !strings.HasSuffix(string(b), "\n") {
		lines++
	}
	assert.LessOrEqual(t, lines, readmeMaxLines, "README.md has %d lines: move detail into a guide under docs/ and link it", lines)
}

// headingSlug is the anchor GitHub gives a heading: its text (a link's text for a link)
// lowercased, without punctuation but hyphens and underscores, each space a hyphen.
func headingSlug(heading string) string {
	heading = inlineLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// markdownAnchors returns the anchors of a Markdown page: one per heading outside code
// blocks, a repeated one numbered -1, -2, … as GitHub does, and HTML anchors.
func markdownAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	for _, line := range strings.Split(proseOnly(text), "\n") {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		m := markdownHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := headingSlug(m[1])
		unique := slug
		for n := 1; anchors[unique]; n++ {
			unique = slug + "-" + strconv.Itoa(n)
		}
		anchors[unique] = true
	}
	return anchors
}

// proseOnly blanks the lines of fenced code blocks, where a # starts a comment, not a
// heading, and brackets are code.
func proseOnly(text string) string {
	lines := strings.Split(text, "\n")
	fence := ""
	for i, line := range lines {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			fence = trimmed[:3]
			lines[i] = ""
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// goComments returns the line comments of a Go file, where godoc points at documents.
func goComments(src string) string {
	var b strings.Builder
	for _, line := range strings.Split(src, "\n") {
		if _, comment, ok := strings.Cut(line, "//"); ok && !strings.Contains(line, `"`) {
			b.WriteString(comment)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
