package sluice_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	// markdownLink is a link target in Markdown: [text](target).
	markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// docMention is a Markdown file named in prose or a comment, with or without a directory.
	docMention = regexp.MustCompile(`[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b`)
)

// Issue 17: godoc pointed at a DESIGN.md the repository did not hold. Every relative
// Markdown link, and every .md file a Go comment or a Markdown page names, must exist.
func TestNoReferenceToAMissingFile(t *testing.T) {
	basenames := map[string]bool{}
	var files []string
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
