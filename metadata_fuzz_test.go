package sluice_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
)

// The metadata readers take headers from any producer. These fuzz targets check the rules
// their documentation states, on arbitrary text; the seed corpus (here and in
// testdata/fuzz) runs with every `go test`.

// FuzzRetryCount checks RetryCount's fixed rule: never outside [0, MaxRetryCountHeader],
// exact for an integer in range, clamped for one out of range, 0 for anything else, and a
// fixed point for the text the retry step writes back.
func FuzzRetryCount(f *testing.F) {
	for _, seed := range []string{
		"", "0", "1", "5", " 7 ", "\t3\n", "+4", "-1", "-0", "abc", "1e3", "0x10", "3.0",
		"1000000", "1000001", "1000000000000", "9223372036854775807", "9223372036854775808",
		"99999999999999999999999", "-99999999999999999999999", "+99999999999999999999999",
		"٣", "1_000", "\u00a05\u00a0", "\x00", "5\x00",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		md := message.Metadata{sluice.HeaderRetryCount: raw}
		n := sluice.RetryCount(md)
		if n < 0 || n > sluice.MaxRetryCountHeader {
			t.Fatalf("RetryCount(%q) = %d, outside [0, %d]", raw, n, sluice.MaxRetryCountHeader)
		}
		if again := sluice.RetryCount(md); again != n {
			t.Fatalf("RetryCount(%q) is not deterministic: %d then %d", raw, n, again)
		}

		trimmed := strings.TrimSpace(raw)
		want := 0
		if v, err := strconv.ParseInt(trimmed, 10, 64); err == nil {
			want = int(min(max(v, 0), sluice.MaxRetryCountHeader))
		} else if isHugePositive(trimmed) {
			want = sluice.MaxRetryCountHeader
		}
		if n != want {
			t.Fatalf("RetryCount(%q) = %d, want %d", raw, n, want)
		}

		// The retry step writes strconv.Itoa(count+1); reading that back must give it.
		written := strconv.Itoa(n)
		if back := sluice.RetryCount(message.Metadata{sluice.HeaderRetryCount: written}); back != n {
			t.Fatalf("RetryCount(%q) = %d, not a fixed point of %q", written, back, raw)
		}
	})
}

// isHugePositive reports whether s is a decimal integer, optionally signed "+", too large
// for int64: the one kind of unparseable text RetryCount treats as huge, not garbage.
func isHugePositive(s string) bool {
	s = strings.TrimPrefix(s, "+")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true // all digits but ParseInt failed: out of range
}

// maxHistoryJSONBytes bounds x-retry-history as AppendHistory writes it: each entry's two
// strings are at most MaxHistoryMessageBytes, and JSON escaping ("\u0000") grows a byte
// to at most six; the time, attempt and field names fit in the rest.
const maxHistoryJSONBytes = failure.MaxHistoryEntries * (2*6*failure.MaxHistoryMessageBytes + 160)

// FuzzHistory checks that History never returns more than MaxHistoryEntries entries nor an
// oversized or invalid string whatever x-retry-history holds, and that AppendHistory
// always writes a bounded JSON array ending with the new entry after the kept ones.
func FuzzHistory(f *testing.F) {
	valid := `[{"at":"2024-05-01T10:00:00Z","attempt":1,"type":"gateway_timeout","message":"timeout"}]`
	six := "[" + strings.TrimSuffix(strings.Repeat(`{"at":"2024-05-01T10:00:00Z","attempt":1,"type":"t","message":"m"},`, 6), ",") + "]"
	for _, seed := range []struct {
		raw, typ, msg string
		attempt       int
		at            int64
	}{
		{"", "error", "boom", 1, 1714557600},
		{valid, "gateway_timeout", "timeout again", 2, 1714557601},
		{six, "t", "m", 7, 1714557602},
		{`not json`, "error", "x", 1, 0},
		{`{"at":"2024-05-01T10:00:00Z"}`, "error", "x", 1, 0},
		{`[null,{},{"attempt":"x"}]`, "error", "x", 1, 0},
		{`[{"at":"0000-01-01T00:00:00+01:00","attempt":-5,"type":"` + strings.Repeat("\\u0000", 200) + `","message":"\ud800"}]`, "\xff\xfe", strings.Repeat("é", 200), -1, 253402300799},
		{`[{"attempt":99999999999999999999}]`, strings.Repeat("x", 1000), "", 0, -62135596800},
		{"[" + strings.Repeat(`{"message":"`+strings.Repeat("m", 300)+`"},`, 40) + `{}]`, "error", "big", 3, 1},
	} {
		f.Add(seed.raw, seed.typ, seed.msg, seed.attempt, seed.at)
	}
	// Times the retry step can write: years 1..9999 (encoding/json cannot write others).
	const minSec, maxSec = -62135596800, 253402300799
	f.Fuzz(func(t *testing.T, raw, typ, msg string, attempt int, atSec int64) {
		md := message.Metadata{sluice.HeaderRetryHistory: raw}
		entries := failure.History(md)
		checkEntries(t, "History", entries)

		at := time.Unix(min(max(atSec, minSec), maxSec), 0).UTC()
		e := failure.HistoryEntry{At: at, Attempt: attempt, Type: typ, Message: msg}
		out := failure.AppendHistory(md, e)
		if out == "" || len(out) > maxHistoryJSONBytes {
			t.Fatalf("AppendHistory wrote %d bytes, want 1..%d", len(out), maxHistoryJSONBytes)
		}
		var asJSON []map[string]any
		if err := json.Unmarshal([]byte(out), &asJSON); err != nil {
			t.Fatalf("AppendHistory wrote invalid JSON %q: %v", out, err)
		}
		got := failure.History(message.Metadata{sluice.HeaderRetryHistory: out})
		checkEntries(t, "History(AppendHistory)", got)
		wantLen := min(len(entries)+1, failure.MaxHistoryEntries)
		if len(got) != wantLen {
			t.Fatalf("AppendHistory kept %d entries, want %d (had %d)", len(got), wantLen, len(entries))
		}
		last := got[len(got)-1]
		if !last.At.Equal(at) || last.Attempt != attempt {
			t.Fatalf("last entry is %+v, want at %s attempt %d", last, at, attempt)
		}
		if utf8.ValidString(typ) && last.Type != failure.Truncate(typ, failure.MaxHistoryMessageBytes) {
			t.Fatalf("last entry type %q, want %q truncated", last.Type, typ)
		}
		if utf8.ValidString(msg) && last.Message != failure.Truncate(msg, failure.MaxHistoryMessageBytes) {
			t.Fatalf("last entry message %q, want %q truncated", last.Message, msg)
		}
		// The older entries are the newest of the previous history, unchanged.
		kept := entries[len(entries)-(wantLen-1):]
		for i, old := range kept {
			g := got[i]
			if !g.At.Equal(old.At) || g.Attempt != old.Attempt || g.Type != old.Type || g.Message != old.Message {
				t.Fatalf("entry %d changed from %+v to %+v", i, old, g)
			}
		}
	})
}

func checkEntries(t *testing.T, what string, entries []failure.HistoryEntry) {
	t.Helper()
	if len(entries) > failure.MaxHistoryEntries {
		t.Fatalf("%s returned %d entries, more than %d", what, len(entries), failure.MaxHistoryEntries)
	}
	for i, e := range entries {
		for field, s := range map[string]string{"type": e.Type, "message": e.Message} {
			if len(s) > failure.MaxHistoryMessageBytes {
				t.Fatalf("%s entry %d %s has %d bytes, more than %d", what, i, field, len(s), failure.MaxHistoryMessageBytes)
			}
			if !utf8.ValidString(s) {
				t.Fatalf("%s entry %d %s %q is not valid UTF-8", what, i, field, s)
			}
		}
	}
}

// FuzzTime checks that Time accepts exactly the RFC 3339 times not later than now plus a
// minute, returns them unchanged, and that what FormatTime writes reads back.
func FuzzTime(f *testing.F) {
	for _, seed := range []struct {
		raw string
		now int64
	}{
		{"2024-05-01T10:00:00Z", 1714557600},
		{"2024-05-01T10:00:59.999999999Z", 1714557600},
		{"2024-05-01T10:01:00.000000001Z", 1714557600},
		{"2024-05-01T12:00:00+02:00", 1714557600},
		{"2024-05-01 10:00:00", 1714557600},
		{"2024-02-30T10:00:00Z", 1714557600},
		{"0000-01-01T00:00:00+01:00", 1714557600},
		{"9999-12-31T23:59:59-23:59", 1714557600},
		{"", 0},
		{"garbage", 0},
		{"1714557600", 1714557600},
	} {
		f.Add(seed.raw, seed.now)
	}
	const key = headers.FirstFailureTime
	f.Fuzz(func(t *testing.T, raw string, nowSec int64) {
		now := time.Unix(nowSec, 0)
		got, ok := failure.Time(message.Metadata{key: raw}, key, now)
		parsed, err := time.Parse(time.RFC3339Nano, raw)
		wantOK := raw != "" && err == nil && !parsed.After(now.Add(time.Minute))
		if ok != wantOK {
			t.Fatalf("Time(%q, now %s) ok = %v, want %v (parse error %v)", raw, now, ok, wantOK, err)
		}
		if !ok {
			if !got.IsZero() {
				t.Fatalf("Time(%q) = %s with ok=false, want the zero time", raw, got)
			}
			return
		}
		if !got.Equal(parsed) {
			t.Fatalf("Time(%q) = %s, want %s", raw, got, parsed)
		}
		// FormatTime writes UTC; a time whose UTC year leaves 0..9999 has no RFC 3339 form
		// (the reader then treats it as absent, which the retry step handles as "now").
		if y := got.UTC().Year(); y < 0 || y > 9999 {
			return
		}
		again, ok := failure.Time(message.Metadata{key: failure.FormatTime(got)}, key, now)
		if !ok || !again.Equal(got) {
			t.Fatalf("FormatTime(%s) = %q reads back as %s, ok=%v", got, failure.FormatTime(got), again, ok)
		}
	})
}
