package sluice

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Metadata keys that travel with a message across retries and into the dead-letter queue.
// sluice writes them; a producer may send them too, and every reader treats what it finds
// as untrusted input (see RetryCount).
const (
	// HeaderRetryCount is how many retries the message has had: attempt = count + 1.
	HeaderRetryCount = "x-retry-count"
	// HeaderFirstFailureTime is the RFC 3339 time of the first failed attempt.
	HeaderFirstFailureTime = "x-first-failure-time"
	// HeaderLastFailureTime is the RFC 3339 time of the latest failed attempt.
	HeaderLastFailureTime = "x-last-failure-time"
	// HeaderLastError is the type of the latest error (see ErrorType).
	HeaderLastError = "x-last-error"
	// HeaderLastErrorMessage is the latest error's text (see ErrorMessage: a panic is its
	// value, never its stack), truncated to MaxErrorMessageBytes.
	HeaderLastErrorMessage = "x-last-error-message"
	// HeaderOriginalQueue is the queue the message was first consumed from.
	HeaderOriginalQueue = "x-original-queue"
	// HeaderRetryHistory is a JSON array of the last MaxHistoryEntries failed attempts.
	HeaderRetryHistory = "x-retry-history"
	// HeaderDeferCount is how many times the message was deferred (attempts not used).
	HeaderDeferCount = "x-defer-count"
	// HeaderFirstDeferTime is the RFC 3339 time of the first deferral.
	HeaderFirstDeferTime = "x-first-defer-time"
	// HeaderIdempotencyKey, when a producer sets it, is the key the idempotency step uses.
	HeaderIdempotencyKey = "idempotency-key"
	// Failure record of a dead-lettered message (see package poison). x-error-type is
	// ErrorType's name, x-error-message ErrorMessage's text, and x-error-stack the only
	// place a panic's stack is kept.
	HeaderErrorType    = "x-error-type"
	HeaderErrorMessage = "x-error-message"
	HeaderErrorStack   = "x-error-stack"
	HeaderHandler      = "x-handler"
	HeaderFailedAt     = "x-failed-at"
	HeaderFailedHost   = "x-failed-host"
	HeaderFailedPID    = "x-failed-pid"
	HeaderErrorClass   = "x-error-class"
	// HeaderReplayCount counts replays from the dead-letter queue.
	HeaderReplayCount = "x-replay-count"
	// HeaderTraceParent and HeaderTraceState carry W3C trace context.
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// Limits on what failure records keep, so a message's headers stay bounded whatever fails.
const (
	// MaxErrorMessageBytes is the size an error message is truncated to in headers.
	MaxErrorMessageBytes = 512
	// MaxHistoryEntries is how many failed attempts x-retry-history keeps (the latest).
	MaxHistoryEntries = 5
	// MaxHistoryMessageBytes is the size of one history entry's error message.
	MaxHistoryMessageBytes = 128
	// MaxRetryCountHeader is the largest x-retry-count a reader accepts as a number; any
	// larger value is treated as this one, which exceeds every sane retry policy.
	MaxRetryCountHeader = 1_000_000
)

// HistoryEntry is one failed attempt in x-retry-history.
type HistoryEntry struct {
	At      time.Time `json:"at"`
	Attempt int       `json:"attempt"`
	Type    string    `json:"type"`
	Message string    `json:"message"`
}

// RetryCount reads x-retry-count by a fixed rule, so that a producer cannot grant a message
// unlimited retries nor crash a consumer: a missing, unparseable or negative value counts
// as 0 (the first failure); a value above MaxRetryCountHeader counts as MaxRetryCountHeader.
// Retries are bounded anyway, because sluice itself increments the count on every retry.
func RetryCount(md message.Metadata) int {
	raw := strings.TrimSpace(md.Get(HeaderRetryCount))
	if raw == "" {
		return 0
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		// A number too large for int64 parses as a range error: it is huge, not garbage.
		// ParseInt reports the overflow before it reaches a later invalid character, so
		// "99999999999999999999x" is a range error too: it is garbage all the same.
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange && isDigits(strings.TrimPrefix(raw, "+")) {
			return MaxRetryCountHeader
		}
		return 0
	}
	if n < 0 {
		return 0
	}
	if n > MaxRetryCountHeader {
		return MaxRetryCountHeader
	}
	return int(n)
}

// isDigits reports whether s is a non-empty run of ASCII digits.
func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
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
	raw := md.Get(HeaderRetryHistory)
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
