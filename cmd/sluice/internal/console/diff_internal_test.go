package console

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func render(d []DiffLine) string {
	var b strings.Builder
	for _, l := range d {
		if l.Skipped > 0 {
			b.WriteString("…\n")
			continue
		}
		b.WriteString(l.Op + l.Text + "\n")
	}
	return b.String()
}

func TestLineDiff(t *testing.T) {
	cases := []struct {
		name, old, new, want string
	}{
		{"equal", "a\nb\n", "a\nb\n", " a\n b\n"},
		{"a changed line", "a\nb\nc", "a\nB\nc", " a\n-b\n+B\n c\n"},
		{"added at the end", "a", "a\nb", " a\n+b\n"},
		{"removed at the start", "a\nb", "b", "-a\n b\n"},
		{"from nothing", "", "x", "+x\n"},
		{"to nothing", "x", "", "-x\n"},
		{"moved line", "a\nb\nc\nd", "b\nc\na\nd", "-a\n b\n c\n+a\n d\n"},
		{"long unchanged runs collapse", "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\nx\n11\n12\n13\n14\n15\n16\n17\n18",
			"1\n2\n3\n4\n5\n6\n7\n8\n9\n10\ny\n11\n12\n13\n14\n15\n16\n17\n18",
			"…\n 8\n 9\n 10\n-x\n+y\n 11\n 12\n 13\n…\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, render(lineDiff(tc.old, tc.new)))
		})
	}
	// Numbers follow each side.
	d := lineDiff("a\nb\nc", "a\nx\ny\nc")
	assert.Equal(t, []DiffLine{{" ", "a", 1, 1, 0}, {"-", "b", 2, 0, 0}, {"+", "x", 0, 2, 0}, {"+", "y", 0, 3, 0}, {" ", "c", 3, 4, 0}}, d)
	// A middle too large for the table is shown removed, then added.
	big := strings.Repeat("l\n", 3000)
	d = lineDiff("x\n"+big, "y\n"+strings.Repeat("m\n", 3000))
	removed, added := diffStats(d)
	assert.Equal(t, 3001, removed)
	assert.Equal(t, 3001, added)
}

func TestParseEditFields(t *testing.T) {
	set, err := parseSetHeaders("tenant=globex\r\n\n x-a = b=c \n")
	assert.NoError(t, err)
	assert.Equal(t, map[string]string{"tenant": "globex", "x-a": " b=c "}, set)
	_, err = parseSetHeaders("novalue")
	assert.Error(t, err)
	assert.Equal(t, []string{"a", "b", "c"}, parseUnsetHeaders("a, b\nc\r\na"))
	p, ok := prettyJSON(`{"a":1,"b":[1,2]}`, "", false)
	assert.True(t, ok)
	assert.Equal(t, "{\n  \"a\": 1,\n  \"b\": [\n    1,\n    2\n  ]\n}", p)
	_, ok = prettyJSON(`{"a":1}`, "text/plain", false)
	assert.False(t, ok, "not JSON by its content type")
	_, ok = prettyJSON(`{"a":`, "application/json", false)
	assert.False(t, ok, "does not parse")
	_, ok = prettyJSON(`{"a":1}`, "application/vnd.x+json; charset=utf-8", true)
	assert.False(t, ok, "a cut preview is shown as it is")
}
