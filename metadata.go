package sluice

import (
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Metadata keys that travel with a message across retries and into the dead-letter queue,
// those a handler or a reader of the dead-letter queue uses (the rest of sluice's headers,
// timestamps, trace context and the host part of the failure record, are internal).
// sluice writes them; a producer may send them too, and every reader treats what it finds
// as untrusted input (see RetryCount).
const (
	// HeaderRetryCount is how many retries the message has had: attempt = count + 1.
	HeaderRetryCount = "x-retry-count"
	// HeaderLastError is the type of the latest error (see ErrorType).
	HeaderLastError = "x-last-error"
	// HeaderLastErrorMessage is the latest error's text (see ErrorMessage: a panic is its
	// value, never its stack), truncated to 512 bytes.
	HeaderLastErrorMessage = "x-last-error-message"
	// HeaderOriginalQueue is the queue the message was first consumed from.
	HeaderOriginalQueue = "x-original-queue"
	// HeaderRetryHistory is a JSON array of the last five failed attempts, each message cut
	// to 128 bytes.
	HeaderRetryHistory = "x-retry-history"
	// HeaderIdempotencyKey, when a producer sets it, is the key the idempotency step uses.
	HeaderIdempotencyKey = "idempotency-key"
	// Failure record of a dead-lettered message (see package poison). x-error-type is
	// ErrorType's name, x-error-message ErrorMessage's text, and x-error-stack the only
	// place a panic's stack is kept.
	HeaderErrorType    = "x-error-type"
	HeaderErrorMessage = "x-error-message"
	HeaderErrorStack   = "x-error-stack"
)

// MaxRetryCountHeader is the largest x-retry-count a reader accepts as a number; any
// larger value is treated as this one, which exceeds every sane retry policy.
const MaxRetryCountHeader = 1_000_000

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
