// Package failure holds the plumbing of sluice's failure records: the hand-off error, the
// bounded x-retry-history and the header time format, shared by the retry and poison steps,
// telemetry and the dlq tools. The header names themselves are package sluice's.
package failure

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
)

// Limits on what failure records keep, so a message's headers stay bounded whatever fails.
const (
	// MaxErrorMessageBytes is the size an error message is truncated to in headers.
	MaxErrorMessageBytes = 512
	// MaxHistoryEntries is how many failed attempts x-retry-history keeps (the latest).
	MaxHistoryEntries = 5
	// MaxHistoryMessageBytes is the size of one history entry's error message.
	MaxHistoryMessageBytes = 128
)

// HistoryEntry is one failed attempt in x-retry-history.
type HistoryEntry struct {
	At      time.Time `json:"at"`
	Attempt int       `json:"attempt"`
	Type    string    `json:"type"`
	Message string    `json:"message"`
}

// Time reads an RFC 3339 time header. A missing or unparseable value, or one later than
// now plus a minute of clock skew, reports ok=false.
func Time(md message.Metadata, key string, now time.Time) (time.Time, bool) {
	raw := md.Get(key)
	if raw == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, raw)
	if err != nil || t.After(now.Add(time.Minute)) {
		return time.Time{}, false
	}
	return t, true
}

// FormatTime writes a time the way Time reads it.
func FormatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// History reads x-retry-history. Anything that is not a JSON array of entries yields nil;
// at most MaxHistoryEntries entries are kept, each message truncated.
func History(md message.Metadata) []HistoryEntry {
	raw := md.Get(sluice.HeaderRetryHistory)
	if raw == "" {
		return nil
	}
	var entries []HistoryEntry
	if err := json.Unmarshal([]byte(raw), &entries); err != nil {
		return nil
	}
	if len(entries) > MaxHistoryEntries {
		entries = entries[len(entries)-MaxHistoryEntries:]
	}
	for i := range entries {
		entries[i].Type = Truncate(entries[i].Type, MaxHistoryMessageBytes)
		entries[i].Message = Truncate(entries[i].Message, MaxHistoryMessageBytes)
	}
	return entries
}

// AppendHistory returns x-retry-history with e appended and the oldest entries dropped.
//
// It writes what json.Marshal writes for the entries (history_test.go holds it to that),
// without json's reflection and its four allocations: every failed attempt writes one.
func AppendHistory(md message.Metadata, e HistoryEntry) string {
	e.Message = Truncate(e.Message, MaxHistoryMessageBytes)
	e.Type = Truncate(e.Type, MaxHistoryMessageBytes)
	old := History(md)
	if len(old) >= MaxHistoryEntries {
		old = old[len(old)-MaxHistoryEntries+1:]
	}
	// Room for a few entries with short texts; a longer history grows onto the heap.
	var buf [512]byte
	b := append(buf[:0], '[')
	for _, o := range old {
		var ok bool
		if b, ok = appendEntryJSON(b, o); !ok {
			return "" // json.Marshal's error (a time it cannot write), which left b nil
		}
		b = append(b, ',')
	}
	b, ok := appendEntryJSON(b, e)
	if !ok {
		return ""
	}
	return string(append(b, ']'))
}

// appendEntryJSON appends e as json.Marshal writes it. It reports false where json.Marshal
// fails: a time whose year is outside [0,9999] or whose zone has no RFC 3339 offset.
func appendEntryJSON(b []byte, e HistoryEntry) ([]byte, bool) {
	b = append(b, `{"at":"`...)
	n0 := len(b)
	b = e.At.AppendFormat(b, time.RFC3339Nano)
	// time.Time.MarshalJSON's checks of what it formatted.
	switch {
	case b[n0+len("9999")] != '-':
		return b, false
	case b[len(b)-1] != 'Z':
		c := b[len(b)-len("Z07:00")]
		h := b[len(b)-len("07:00"):]
		if ('0' <= c && c <= '9') || 10*(h[0]-'0')+(h[1]-'0') >= 24 {
			return b, false
		}
	}
	b = append(b, `","attempt":`...)
	b = strconv.AppendInt(b, int64(e.Attempt), 10)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, e.Type)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, e.Message)
	return append(b, '}'), true
}

// appendJSONString appends s quoted as encoding/json quotes a string: HTML characters,
// U+2028 and U+2029 escaped, and invalid UTF-8 replaced by U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// Truncate shortens s to at most n bytes without splitting a UTF-8 sequence, marking the cut
// with "…" inside the limit (a limit too small for the mark gets no mark).
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	withMark := n >= len(mark)
	cut := max(n, 0)
	if withMark {
		cut -= len(mark)
	}
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if !withMark {
		return s[:cut]
	}
	return s[:cut] + mark
}
