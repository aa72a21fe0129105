package failure_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/failure"
)

// jsonAppendHistory is AppendHistory as json.Marshal wrote it, which AppendHistory must
// match byte for byte: the header is on the wire, and the dlq tools read it.
func jsonAppendHistory(md message.Metadata, e failure.HistoryEntry) string {
	e.Message = failure.Truncate(e.Message, failure.MaxHistoryMessageBytes)
	e.Type = failure.Truncate(e.Type, failure.MaxHistoryMessageBytes)
	entries := append(failure.History(md), e)
	if len(entries) > failure.MaxHistoryEntries {
		entries = entries[len(entries)-failure.MaxHistoryEntries:]
	}
	b, _ := json.Marshal(entries)
	return string(b)
}

var historyTexts = []string{
	"", "plain", `quote " and \ backslash`, "<b>html</b> & more", "tab\tnew\nline\rcr\bbs\fff",
	"\x00\x01\x1f\x7f", "invalid \xff\xfe utf-8", "cut \xe2\x82", "line\u2028para\u2029", "ünïcödé ✓ 𝄞",
	strings.Repeat("é", 100), strings.Repeat("<", 200),
}

func TestAppendHistoryWritesWhatJSONWrites(t *testing.T) {
	at := time.Date(2026, 12, 2, 15, 4, 5, 123456789, time.UTC)
	histories := []string{
		"",
		"not json",
		`[{"at":"2026-01-02T03:04:05Z","attempt":1,"type":"error","message":"first"}]`,
		`[{"at":"2026-01-02T03:04:05.5+05:30","attempt":2,"type":"t","message":"offset"}]`,
		`[{"attempt":-3}]`,
		`[{"at":"2026-01-02T03:04:05Z","attempt":1},{"attempt":2},{"attempt":3},{"attempt":4},{"attempt":5},{"attempt":6}]`,
	}
	times := []time.Time{at, at.Truncate(time.Second), time.Time{}, at.In(time.FixedZone("x", -7*3600)),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		at.In(time.FixedZone("far", 25*3600)), at.In(time.FixedZone("sec", 3600+30))}
	for _, h := range histories {
		md := message.Metadata{}
		if h != "" {
			md[sluice.HeaderRetryHistory] = h
		}
		for _, text := range historyTexts {
			for _, when := range times {
				e := failure.HistoryEntry{At: when, Attempt: len(text), Type: text, Message: text + text}
				if got, want := failure.AppendHistory(md, e), jsonAppendHistory(md, e); got != want {
					t.Fatalf("history %q, entry %+v:\n got %s\nwant %s", h, e, got, want)
				}
			}
		}
	}
}

func FuzzAppendHistoryWritesWhatJSONWrites(f *testing.F) {
	for _, s := range historyTexts {
		f.Add(s, s, 1, int64(0))
	}
	f.Fuzz(func(t *testing.T, typ, msg string, attempt int, unix int64) {
		md := message.Metadata{sluice.HeaderRetryHistory: `[{"at":"2026-01-02T03:04:05Z","attempt":1,"type":"` + typ + `","message":"x"}]`}
		e := failure.HistoryEntry{At: time.Unix(unix, unix%1e9).UTC(), Attempt: attempt, Type: typ, Message: msg}
		if got, want := failure.AppendHistory(md, e), jsonAppendHistory(md, e); got != want {
			t.Fatalf("got %s\nwant %s", got, want)
		}
	})
}

func TestAppendHistoryAllocatesOnce(t *testing.T) {
	e := failure.HistoryEntry{At: time.Now().UTC(), Attempt: 1, Type: "error", Message: "card declined"}
	md := message.Metadata{}
	if n := testing.AllocsPerRun(100, func() { _ = failure.AppendHistory(md, e) }); n != 1 {
		t.Fatalf("AppendHistory of a first failure allocates %v times, want 1", n)
	}
}
