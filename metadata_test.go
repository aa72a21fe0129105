package sluice_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
)

func TestRetryCount(t *testing.T) {
	limit := sluice.MaxRetryCountHeader
	tests := []struct {
		name string
		md   message.Metadata
		want int
	}{
		{"missing", message.Metadata{}, 0},
		{"nil metadata", nil, 0},
		{"empty", message.Metadata{sluice.HeaderRetryCount: ""}, 0},
		{"zero", message.Metadata{sluice.HeaderRetryCount: "0"}, 0},
		{"three", message.Metadata{sluice.HeaderRetryCount: "3"}, 3},
		{"surrounding spaces", message.Metadata{sluice.HeaderRetryCount: " 3 "}, 3},
		{"tab and newline", message.Metadata{sluice.HeaderRetryCount: "\t3\n"}, 3},
		{"plus sign", message.Metadata{sluice.HeaderRetryCount: "+3"}, 3},
		{"negative", message.Metadata{sluice.HeaderRetryCount: "-1"}, 0},
		{"letters", message.Metadata{sluice.HeaderRetryCount: "abc"}, 0},
		{"exponent", message.Metadata{sluice.HeaderRetryCount: "1e3"}, 0},
		{"decimal", message.Metadata{sluice.HeaderRetryCount: "3.0"}, 0},
		{"hex", message.Metadata{sluice.HeaderRetryCount: "0x10"}, 0},
		{"space inside", message.Metadata{sluice.HeaderRetryCount: "1 2"}, 0},
		{"at the header limit", message.Metadata{sluice.HeaderRetryCount: strconv.Itoa(limit)}, limit},
		{"one below the limit", message.Metadata{sluice.HeaderRetryCount: strconv.Itoa(limit - 1)}, limit - 1},
		{"one above the limit", message.Metadata{sluice.HeaderRetryCount: strconv.Itoa(limit + 1)}, limit},
		{"10^12", message.Metadata{sluice.HeaderRetryCount: "1000000000000"}, limit},
		{"max int64", message.Metadata{sluice.HeaderRetryCount: "9223372036854775807"}, limit},
		{"beyond int64", message.Metadata{sluice.HeaderRetryCount: "9223372036854775808"}, limit},
		{"far beyond int64", message.Metadata{sluice.HeaderRetryCount: strings.Repeat("9", 40)}, limit},
		{"far beyond int64 with plus", message.Metadata{sluice.HeaderRetryCount: "+" + strings.Repeat("9", 40)}, limit},
		{"far below int64", message.Metadata{sluice.HeaderRetryCount: "-" + strings.Repeat("9", 40)}, 0},
		{"huge with trailing garbage", message.Metadata{sluice.HeaderRetryCount: strings.Repeat("9", 25) + "x"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, sluice.RetryCount(tt.md))
		})
	}
}

func TestTime(t *testing.T) {
	now := time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)
	const key = headers.FirstFailureTime
	tests := []struct {
		name   string
		raw    string
		want   time.Time
		wantOK bool
	}{
		{"missing", "", time.Time{}, false},
		{"RFC 3339", "2025-03-14T14:00:00Z", time.Date(2025, 3, 14, 14, 0, 0, 0, time.UTC), true},
		{"RFC 3339 with nanoseconds", "2025-03-14T14:00:00.123456789Z", time.Date(2025, 3, 14, 14, 0, 0, 123456789, time.UTC), true},
		{"offset", "2025-03-14T16:00:00+02:00", time.Date(2025, 3, 14, 14, 0, 0, 0, time.UTC), true},
		{"now", failure.FormatTime(now), now, true},
		{"within the clock skew", failure.FormatTime(now.Add(59 * time.Second)), now.Add(59 * time.Second), true},
		{"exactly the clock skew", failure.FormatTime(now.Add(time.Minute)), now.Add(time.Minute), true},
		{"beyond the clock skew", failure.FormatTime(now.Add(time.Minute + time.Nanosecond)), time.Time{}, false},
		{"far future", "2999-01-01T00:00:00Z", time.Time{}, false},
		{"garbage", "yesterday", time.Time{}, false},
		{"date only", "2025-03-14", time.Time{}, false},
		{"unix seconds", strconv.FormatInt(now.Unix(), 10), time.Time{}, false},
		{"space instead of T", "2025-03-14 14:00:00Z", time.Time{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := failure.Time(message.Metadata{key: tt.raw}, key, now)
			assert.Equal(t, tt.wantOK, ok)
			assert.True(t, tt.want.Equal(got), "Time(%q) = %s, want %s", tt.raw, got, tt.want)
		})
	}
}

func TestFormatTime(t *testing.T) {
	local := time.FixedZone("UTC+5", 5*60*60)
	in := time.Date(2025, 1, 2, 8, 4, 5, 600, local)
	s := failure.FormatTime(in)
	assert.Equal(t, "2025-01-02T03:04:05.0000006Z", s, "written in UTC")
	got, ok := failure.Time(message.Metadata{"k": s}, "k", in)
	require.True(t, ok)
	assert.True(t, in.Equal(got), "read back %s, want %s", got, in)
}

// historyJSON returns an x-retry-history of n entries with attempts 1..n.
func historyJSON(t *testing.T, n int, msg string) string {
	t.Helper()
	entries := make([]failure.HistoryEntry, n)
	for i := range entries {
		entries[i] = failure.HistoryEntry{
			At:      time.Date(2025, 1, 1, 0, i, 0, 0, time.UTC),
			Attempt: i + 1,
			Type:    "error",
			Message: msg,
		}
	}
	b, err := json.Marshal(entries)
	require.NoError(t, err)
	return string(b)
}

func attemptsOf(entries []failure.HistoryEntry) []int {
	out := make([]int, len(entries))
	for i, e := range entries {
		out[i] = e.Attempt
	}
	return out
}

func TestHistory(t *testing.T) {
	long := strings.Repeat("m", 1000)
	huge := (1 << 20) / len(long) // entries in a 1 MiB history
	tests := []struct {
		name         string
		raw          string
		wantAttempts []int // nil: History returns nil
	}{
		{"missing", "", nil},
		{"garbage", "not json", nil},
		{"an object, not an array", `{"attempt":1}`, nil},
		{"JSON null", "null", nil},
		{"wrong field type", `[{"attempt":"one"}]`, nil},
		{"one entry", historyJSON(t, 1, "x"), []int{1}},
		{"at the bound", historyJSON(t, failure.MaxHistoryEntries, "x"), []int{1, 2, 3, 4, 5}},
		{"beyond the bound keeps the latest", historyJSON(t, 8, "x"), []int{4, 5, 6, 7, 8}},
		{"long messages", historyJSON(t, 2, long), []int{1, 2}},
		{"1 MiB history", historyJSON(t, huge, long), []int{huge - 4, huge - 3, huge - 2, huge - 1, huge}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := failure.History(message.Metadata{sluice.HeaderRetryHistory: tt.raw})
			if tt.wantAttempts == nil {
				assert.Nil(t, got)
				return
			}
			assert.Equal(t, tt.wantAttempts, attemptsOf(got))
			for _, e := range got {
				assert.LessOrEqual(t, len(e.Message), failure.MaxHistoryMessageBytes)
				assert.LessOrEqual(t, len(e.Type), failure.MaxHistoryMessageBytes)
				assert.True(t, strings.HasPrefix(e.Message, "m") || e.Message == "x", "message %q", e.Message)
			}
		})
	}
}

func TestAppendHistory(t *testing.T) {
	at := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name         string
		raw          string
		entry        failure.HistoryEntry
		wantAttempts []int
	}{
		{"to nothing", "", failure.HistoryEntry{At: at, Attempt: 1, Type: "error", Message: "boom"}, []int{1}},
		{"to garbage", "{{{", failure.HistoryEntry{At: at, Attempt: 4, Type: "error", Message: "boom"}, []int{4}},
		{"below the bound", historyJSON(t, 2, "x"), failure.HistoryEntry{At: at, Attempt: 3, Type: "error", Message: "boom"}, []int{1, 2, 3}},
		{"at the bound drops the oldest", historyJSON(t, 5, "x"), failure.HistoryEntry{At: at, Attempt: 6, Type: "error", Message: "boom"}, []int{2, 3, 4, 5, 6}},
		{"beyond the bound", historyJSON(t, 9, "x"), failure.HistoryEntry{At: at, Attempt: 10, Type: "error", Message: "boom"}, []int{6, 7, 8, 9, 10}},
		{
			"long type and message are truncated", "",
			failure.HistoryEntry{At: at, Attempt: 1, Type: strings.Repeat("t", 500), Message: strings.Repeat("é", 500)},
			[]int{1},
		},
		{
			"1 MiB history is cut", historyJSON(t, 1024, strings.Repeat("m", 1024)),
			failure.HistoryEntry{At: at, Attempt: 1025, Type: "error", Message: strings.Repeat("m", 1<<20)},
			[]int{1021, 1022, 1023, 1024, 1025},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := failure.AppendHistory(message.Metadata{sluice.HeaderRetryHistory: tt.raw}, tt.entry)
			// Each entry is two bounded strings plus a time and a number: a few KiB at most.
			assert.Less(t, len(out), 4<<10, "x-retry-history must stay small")
			assert.True(t, json.Valid([]byte(out)), "x-retry-history %q is not JSON", out)

			got := failure.History(message.Metadata{sluice.HeaderRetryHistory: out})
			assert.Equal(t, tt.wantAttempts, attemptsOf(got))
			last := got[len(got)-1]
			assert.True(t, tt.entry.At.Equal(last.At), "at %s, want %s", last.At, tt.entry.At)
			assert.Equal(t, failure.Truncate(tt.entry.Type, failure.MaxHistoryMessageBytes), last.Type)
			assert.Equal(t, failure.Truncate(tt.entry.Message, failure.MaxHistoryMessageBytes), last.Message)
			assert.True(t, utf8.ValidString(last.Message))
		})
	}
}

func TestTruncate(t *testing.T) {
	tests := []struct {
		name string
		s    string
		n    int
		want string
	}{
		{"shorter", "abc", 10, "abc"},
		{"exact", "abcdef", 6, "abcdef"},
		{"empty", "", 0, ""},
		{"ASCII cut", "abcdefghij", 8, "abcde…"},
		{"cut at the marker's size", "abcdefghij", 3, "…"},
		{"two-byte runes, cut inside one", "ééééé", 6, "é…"},
		{"two-byte runes, cut between", "ééééé", 7, "éé…"},
		{"four-byte rune not split", "a😀😀", 7, "a…"},
		{"four-byte rune kept whole", "a😀😀", 8, "a😀…"},
		{"limit below the marker", "abcdef", 2, "ab"},
		{"limit below the marker, multibyte", "éé", 1, ""},
		{"zero limit", "abc", 0, ""},
		{"negative limit", "abc", -1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := failure.Truncate(tt.s, tt.n)
			assert.Equal(t, tt.want, got)
			assert.LessOrEqual(t, len(got), max(tt.n, 0), "the result, marker included, fits the limit")
			assert.True(t, utf8.ValidString(got))
		})
	}
}

// Every limit on strings mixing rune widths gives a valid prefix, marked, within the limit.
func TestTruncate_EveryLimit(t *testing.T) {
	for _, s := range []string{"plain ascii text", "héllo wörld ñ", "日本語のテキスト", "a😀b😀c😀", "…already…"} {
		for n := 0; n <= len(s)+1; n++ {
			t.Run(fmt.Sprintf("%s/%d", s, n), func(t *testing.T) {
				got := failure.Truncate(s, n)
				require.LessOrEqual(t, len(got), n)
				require.True(t, utf8.ValidString(got), "%q", got)
				if n >= len(s) {
					require.Equal(t, s, got)
					return
				}
				if n >= len("…") {
					require.True(t, strings.HasSuffix(got, "…"), "%q has no cut marker", got)
					require.True(t, strings.HasPrefix(s, strings.TrimSuffix(got, "…")), "%q is not a prefix of %q", got, s)
				} else {
					require.True(t, strings.HasPrefix(s, got))
				}
			})
		}
	}
}

type ctxKey struct{}

// The hand-offs (retry, dead letter) publish Watermill's CopyWithContext of the delivery:
// these tests hold it to what they need from it.
func TestCopyWithContext(t *testing.T) {
	orig := message.NewMessage("id-1", []byte(`{"amount":10}`))
	orig.Metadata.Set("tenant", "t1")
	orig.Metadata.Set(sluice.HeaderRetryCount, "2")
	ctx := context.WithValue(context.Background(), ctxKey{}, "v")
	orig.SetContext(ctx)

	c := orig.CopyWithContext()
	require.NotSame(t, orig, c)
	assert.Equal(t, orig.UUID, c.UUID)
	assert.Equal(t, orig.Payload, c.Payload)
	assert.Equal(t, orig.Metadata, c.Metadata)
	assert.Equal(t, ctx, c.Context(), "the copy is published with the attempt's context")

	c.Metadata.Set(sluice.HeaderRetryCount, "3")
	c.Metadata.Set("added", "x")
	assert.Equal(t, "2", orig.Metadata.Get(sluice.HeaderRetryCount), "the original's metadata changed with the copy's")
	assert.NotContains(t, orig.Metadata, "added")

	orig.Metadata.Set("tenant", "t2")
	assert.Equal(t, "t1", c.Metadata.Get("tenant"), "the copy's metadata changed with the original's")

	// Acking the copy must not settle the delivery the stack still owns.
	require.True(t, c.Ack())
	select {
	case <-orig.Acked():
		t.Fatal("acking the copy acked the original")
	default:
	}
}

func TestCopyWithContext_NilMetadata(t *testing.T) {
	orig := message.NewMessage("id-2", nil)
	orig.Metadata = nil
	c := orig.CopyWithContext()
	require.NotNil(t, c.Metadata)
	c.Metadata.Set("k", "v") // must not panic on a nil map
	assert.Equal(t, "v", c.Metadata.Get("k"))
}
