// Package failure holds the plumbing of sluice's failure records: the bounded
// x-retry-history and the header time format, shared by the carrier of dispositions
// (internal/carry), the poison step, telemetry and the dlq tools. The header names themselves are package sluice's.
package failure

import (
	"encoding/json"
	"errors"
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
func AppendHistory(md message.Metadata, e HistoryEntry) string {
	e.Message = Truncate(e.Message, MaxHistoryMessageBytes)
	e.Type = Truncate(e.Type, MaxHistoryMessageBytes)
	entries := append(History(md), e)
	if len(entries) > MaxHistoryEntries {
		entries = entries[len(entries)-MaxHistoryEntries:]
	}
	b, _ := json.Marshal(entries) // cannot fail: plain strings, ints and times
	return string(b)
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

// stacker is an error that reports where it happened: an attempt abandoned at its handler
// timeout (package internal/attempt) reports its goroutine's stack.
type stacker interface {
	error
	ErrorStack() string
}

// Stack returns the stack a failure carries, for x-error-stack and the span's exception
// event: a recovered panic's, or the stack an error reports (an abandoned attempt's).
func Stack(err error) (string, bool) {
	if stack, ok := sluice.PanicStack(err); ok {
		return stack, true
	}
	if s, ok := errors.AsType[stacker](err); ok && s.ErrorStack() != "" {
		return s.ErrorStack(), true
	}
	return "", false
}
