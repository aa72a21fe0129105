package sluice_test

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	// goModGoLine is go.mod's go directive.
	goModGoLine = regexp.MustCompile(`(?m)^go (\d+\.\d+(?:\.\d+)?)\s*$`)
	// readmeGoMinimum is how README.md states the oldest Go it supports.
	readmeGoMinimum = regexp.MustCompile(`Go (\d+\.\d+) or later`)
	// ciToolchain is the Go release .ci/run builds with.
	ciToolchain = regexp.MustCompile(`GOTOOLCHAIN=go(\d+\.\d+(?:\.\d+)?)\b`)
	// versionHeading is a changelog section: "## [0.1.0] - 2026-12-01" or "## Unreleased".
	versionHeading = regexp.MustCompile(`^## (.*)$`)
	// releasedHeading is a released version's heading, with its version.
	releasedHeading = regexp.MustCompile(`^\[?v?(\d+\.\d+\.\d+)\]? - \d{4}-\d{2}-\d{2}$`)
	// linkDefinition is a Markdown link reference definition: "[label]: url".
	linkDefinition = regexp.MustCompile(`(?m)^\[([^\]]+)\]:\s*(\S+)`)
	// linkReference is a bracketed label not followed by "(" (an inline link) or ":" (a
	// definition): a full, collapsed or shortcut reference link, [text][label], [label][]
	// or [label].
	linkReference = regexp.MustCompile(`\[([^\]]+)\](?:\[([^\]]*)\])?`)
	// codeSpan is inline code, where brackets are not links.
	codeSpan = regexp.MustCompile("`[^`]*`")
	// tagInURL is a tag a link points at (a release page, a tree, a comparison).
	tagInURL = regexp.MustCompile(`/(?:releases/tag|tree|compare)/(v\d+\.\d+\.\d+)`)
)

// Issue 56: the version story contradicted itself. CHANGELOG had "[0.1.0] - 2026-12-01"
// with links to a tag that did not exist and an undefined "[0.2.0]" label; README's Go
// policy and go.mod's go line were not checked against each other, and CI built with
// whatever Go the machine had.
func TestGoVersionStory(t *testing.T) {
	goMod, err := os.ReadFile("go.mod")
	require.NoError(t, err)
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	ci, err := os.ReadFile(".ci/run")
	require.NoError(t, err)
	assert.Empty(t, goVersionProblems(string(goMod), string(readme), string(ci)))
}

// goVersionProblems says where go.mod's go line, the minimum README.md states and the Go
// .ci/run builds with disagree: the go line is the stated minimum's first release
// (go 1.26.0 for "Go 1.26 or later"), and CI builds with exactly that.
func goVersionProblems(goMod, readme, ci string) []string {
	var problems []string
	m := goModGoLine.FindStringSubmatch(goMod)
	if m == nil {
		return []string{"go.mod has no go line"}
	}
	goLine := m[1]
	minimums := readmeGoMinimum.FindAllStringSubmatch(readme, -1)
	if len(minimums) == 0 {
		problems = append(problems, `README.md states no minimum Go ("Go X.Y or later")`)
	}
	for _, min := range minimums {
		if want := min[1] + ".0"; goLine != want {
			problems = append(problems, fmt.Sprintf("README.md says %q but go.mod says go %s (want go %s)", min[0], goLine, want))
		}
	}
	builds := ciToolchain.FindAllStringSubmatch(ci, -1)
	if len(builds) == 0 {
		problems = append(problems, "CI does not build with the oldest Go allowed: .ci/run sets no GOTOOLCHAIN=go"+goLine)
	}
	for _, b := range builds {
		if b[1] != goLine {
			problems = append(problems, fmt.Sprintf(".ci/run builds with go%s, not go.mod's go %s", b[1], goLine))
		}
	}
	return problems
}

func TestGoVersionProblems(t *testing.T) {
	const ci = "GOTOOLCHAIN=go1.26.0 go vet ./...\n"
	for _, tc := range []struct {
		name, goMod, readme, ci string
		want                    []string
	}{
		{name: "agree", goMod: "module m\n\ngo 1.26.0\n", readme: "Go 1.26 or later.", ci: ci},
		{name: "go line newer than stated", goMod: "go 1.27.0\n", readme: "Go 1.26 or later.", ci: "GOTOOLCHAIN=go1.27.0",
			want: []string{`README.md says "Go 1.26 or later" but go.mod says go 1.27.0 (want go 1.26.0)`}},
		{name: "a patch release is not the minimum", goMod: "go 1.26.3\n", readme: "Go 1.26 or later.", ci: "GOTOOLCHAIN=go1.26.3",
			want: []string{`README.md says "Go 1.26 or later" but go.mod says go 1.26.3 (want go 1.26.0)`}},
		{name: "no stated minimum", goMod: "go 1.26.0\n", readme: "the two newest Go releases", ci: ci,
			want: []string{`README.md states no minimum Go ("Go X.Y or later")`}},
		{name: "CI on the machine's Go", goMod: "go 1.26.0\n", readme: "Go 1.26 or later.", ci: "make test\n",
			want: []string{"CI does not build with the oldest Go allowed: .ci/run sets no GOTOOLCHAIN=go1.26.0"}},
		{name: "CI on another Go", goMod: "go 1.26.0\n", readme: "Go 1.26 or later.", ci: "GOTOOLCHAIN=go1.27.4",
			want: []string{".ci/run builds with go1.27.4, not go.mod's go 1.26.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, goVersionProblems(tc.goMod, tc.readme, tc.ci))
		})
	}
}

// CHANGELOG.md calls released only what is tagged, and every link in it resolves: each
// reference has a definition, and no definition points at a tag that does not exist.
func TestChangelogVersionsAreTagged(t *testing.T) {
	if err := exec.Command("git", "rev-parse", "--git-dir").Run(); err != nil {
		t.Skipf("not a git checkout, so its tags are unknown: %v", err)
	}
	out, err := exec.Command("git", "tag", "--list").Output()
	require.NoError(t, err, "git tag")
	tags := map[string]bool{}
	for _, tag := range strings.Fields(string(out)) {
		tags[tag] = true
	}
	changelog, err := os.ReadFile("CHANGELOG.md")
	require.NoError(t, err)
	assert.Empty(t, changelogProblems(string(changelog), tags), "tags: %v", strings.Fields(string(out)))
}

// changelogProblems lists a changelog's version headings that name an untagged version
// (a heading is "Unreleased" or "[X.Y.Z] - date" with a tag vX.Y.Z), its link references
// without a definition, and its definitions that point at a tag that does not exist.
func changelogProblems(changelog string, tags map[string]bool) []string {
	var problems []string
	defined := map[string]bool{}
	for _, m := range linkDefinition.FindAllStringSubmatch(changelog, -1) {
		label := strings.ToLower(m[1])
		defined[label] = true
		for _, tag := range tagInURL.FindAllStringSubmatch(m[2], -1) {
			if !tags[tag[1]] {
				problems = append(problems, fmt.Sprintf("[%s] links to tag %s, which does not exist", m[1], tag[1]))
			}
		}
	}
	inFence := false
	for i, line := range strings.Split(changelog, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if inFence || linkDefinition.MatchString(line) {
			continue
		}
		if h := versionHeading.FindStringSubmatch(line); h != nil && h[1] != "Unreleased" && h[1] != "[Unreleased]" {
			if v := releasedHeading.FindStringSubmatch(h[1]); v == nil {
				problems = append(problems, fmt.Sprintf("line %d: heading %q is neither Unreleased nor [X.Y.Z] - YYYY-MM-DD", i+1, h[1]))
			} else if !tags["v"+v[1]] {
				problems = append(problems, fmt.Sprintf("line %d: %q is called released, but there is no tag v%s", i+1, h[1], v[1]))
			}
		}
		text := codeSpan.ReplaceAllString(line, "")
		for _, loc := range linkReference.FindAllStringSubmatchIndex(text, -1) {
			if end := loc[1]; end < len(text) && (text[end] == '(' || text[end] == ':') {
				continue // an inline link, or a definition
			}
			label := text[loc[2]:loc[3]]
			if loc[4] >= 0 && loc[5] > loc[4] {
				label = text[loc[4]:loc[5]]
			}
			if !defined[strings.ToLower(label)] {
				problems = append(problems, fmt.Sprintf("line %d: [%s] is a link with no definition", i+1, label))
			}
		}
	}
	return problems
}

func TestChangelogProblems(t *testing.T) {
	tagged := map[string]bool{"v0.1.0": true}
	for _, tc := range []struct {
		name, changelog string
		tags            map[string]bool
		want            []string
	}{
		{name: "all unreleased",
			changelog: "# Changelog\n\nThe format follows [Keep a Changelog](https://keepachangelog.com/).\n\n## Unreleased\n\n### Added\n\n- `x[0]` and `[y]` in code.\n"},
		{name: "a tagged release with its links", tags: tagged,
			changelog: "## [Unreleased]\n\n## [0.1.0] - 2026-12-01\n\n[Unreleased]: https://github.com/o/r/compare/v0.1.0...HEAD\n[0.1.0]: https://github.com/o/r/releases/tag/v0.1.0\n"},
		{name: "what CHANGELOG.md said before: an untagged release, links to it, an undefined label",
			changelog: "## [0.2.0] - Unreleased\n\n## [0.1.0] - 2026-12-01\n\n[Unreleased]: https://github.com/o/r/compare/v0.1.0...HEAD\n[0.1.0]: https://github.com/o/r/releases/tag/v0.1.0\n",
			want: []string{
				"[Unreleased] links to tag v0.1.0, which does not exist",
				"[0.1.0] links to tag v0.1.0, which does not exist",
				`line 1: heading "[0.2.0] - Unreleased" is neither Unreleased nor [X.Y.Z] - YYYY-MM-DD`,
				"line 1: [0.2.0] is a link with no definition",
				`line 3: "[0.1.0] - 2026-12-01" is called released, but there is no tag v0.1.0`,
			}},
		{name: "full and collapsed references", changelog: "See [the notes][notes] and [notes][].\n\n[notes]: https://example.com/notes\n"},
		{name: "an undefined full reference", changelog: "See [the notes][nowhere].\n",
			want: []string{"line 1: [nowhere] is a link with no definition"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, changelogProblems(tc.changelog, tc.tags))
		})
	}
}
