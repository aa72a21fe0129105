package dlq

import (
	"crypto/sha256"
	"encoding/hex"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// A failure group is the set of dead letters that failed the same way: same handler, same
// error type, same fingerprint. The fingerprint says where a message failed:
//
//   - for a panic (error type "panic", or a record with a stack), the top frames of the
//     panicking goroutine's stack below runtime.panic: the first frame with its file and
//     line, the two callers by function name. x-error-stack is read first; a record of an
//     older sluice that has the stack only inside x-error-message ("panic occurred: …,
//     stacktrace: …", Watermill's text) gives the same fingerprint.
//   - for any other error, the first line of the error message with what changes from one
//     message to the next stripped: UUIDs, hexadecimal numbers, and every word that holds a
//     digit (ids such as ord-8812 or pay_77, amounts, counts, codes) become "#", so
//     "order 8812 not found" and "order 9120 not found" are one group.
//
// A group's id is the first 12 hexadecimal digits of the SHA-256 of handler, error type and
// fingerprint: the same on every read and every machine, so an id printed by `sluice dlq
// groups` can be given to `replay --group` later.

// fingerprintFrames is how many stack frames a panic's fingerprint keeps.
const fingerprintFrames = 3

// maxFingerprintBytes bounds a message fingerprint (a long message is still one group).
const maxFingerprintBytes = 200

var (
	uuidPattern  = regexp.MustCompile(`[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`)
	hexPattern   = regexp.MustCompile(`\b0[xX][0-9a-fA-F]+\b|\b[0-9a-fA-F]{16,}\b`)
	digitPattern = regexp.MustCompile(`[\p{L}0-9_]*[0-9][\p{L}0-9_]*`)
	spacePattern = regexp.MustCompile(`\s+`)
)

// panicPrefix is how a recovered panic's text starts: Watermill's RecoveredPanicError's,
// and the router's recoverer's, which writes the same.
const panicPrefix = "panic occurred:"

// groupID returns the id of the group of handler, errorType and fingerprint.
func groupID(handler, errorType, fingerprint string) string {
	sum := sha256.Sum256([]byte(handler + "\x00" + errorType + "\x00" + fingerprint))
	return hex.EncodeToString(sum[:6])
}

// cachedFingerprint returns where a failure happened (see the comment at the top of this file):
// the top stack frames for a panic, else the normalized error message.
func cachedFingerprint(errorType, message, stack string) string {
	key := fingerprintKey{errorType, message, stack}
	if fp, ok := fingerprints.get(key); ok {
		return fp
	}
	fp := fingerprint(errorType, message, stack)
	fingerprints.put(key, fp)
	return fp
}

func fingerprint(errorType, message, stack string) string {
	isPanic := errorType == "panic" || stack != "" || strings.HasPrefix(message, panicPrefix)
	if isPanic {
		if stack == "" {
			if _, after, ok := strings.Cut(message, "stacktrace:"); ok {
				stack = after
			}
		}
		if frames := panicFrames(stack); frames != "" {
			return "panic at " + frames
		}
		// No usable stack: the panic's value, as for any error.
		message = strings.TrimSpace(strings.TrimPrefix(message, panicPrefix))
		if before, _, ok := strings.Cut(message, ", stacktrace:"); ok {
			message = before
			// Watermill quotes a string value (%#v); a newer record holds it bare.
			if v, err := strconv.Unquote(message); err == nil {
				message = v
			}
		}
	}
	return normalizeMessage(message)
}

// normalizeMessage returns the first line of msg with UUIDs, hexadecimal numbers and words
// holding a digit replaced by "#", spaces collapsed, cut to 200 bytes.
func normalizeMessage(msg string) string {
	if i := strings.IndexAny(msg, "\r\n"); i >= 0 {
		msg = msg[:i]
	}
	msg = uuidPattern.ReplaceAllString(msg, "#")
	msg = hexPattern.ReplaceAllString(msg, "#")
	msg = digitPattern.ReplaceAllString(msg, "#")
	msg = strings.TrimSpace(spacePattern.ReplaceAllString(msg, " "))
	if len(msg) > maxFingerprintBytes {
		msg = msg[:maxFingerprintBytes]
	}
	return msg
}

// panicFrames returns the top frames of the panicking code in a runtime/debug.Stack text:
// the frames below the last "panic(" call, less the runtime's own and Watermill's
// recoverer. Empty when the text has no frame.
func panicFrames(stack string) string {
	type frame struct{ fn, file string }
	var frames []frame
	lines := strings.Split(stack, "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if line == "" || strings.HasPrefix(line, "goroutine ") || strings.HasPrefix(line, "created by ") {
			continue
		}
		if strings.HasPrefix(lines[i], "\t") {
			continue // a file line without its function
		}
		fn := line
		if j := strings.LastIndex(fn, "("); j > 0 {
			fn = fn[:j]
		}
		var file string
		if i+1 < len(lines) && strings.HasPrefix(lines[i+1], "\t") {
			file = strings.TrimSpace(lines[i+1])
			if j := strings.LastIndex(file, " +0x"); j > 0 {
				file = file[:j]
			}
			file = path.Base(file)
			i++
		}
		if fn == "panic" {
			frames = frames[:0] // what came before is the recoverer
			continue
		}
		frames = append(frames, frame{fn, file})
	}
	var parts []string
	for _, f := range frames {
		if strings.HasPrefix(f.fn, "runtime.") || strings.HasPrefix(f.fn, "runtime/debug.") ||
			strings.Contains(f.fn, "Recoverer") {
			continue
		}
		if len(parts) == 0 && f.file != "" {
			parts = append(parts, f.fn+" ("+f.file+")")
		} else {
			parts = append(parts, f.fn)
		}
		if len(parts) == fingerprintFrames {
			break
		}
	}
	return strings.Join(parts, " < ")
}

// fingerprintKey is what a fingerprint is computed from.
type fingerprintKey struct{ errorType, message, stack string }

// fingerprintCache remembers recent fingerprints: a DLQ holds many copies of few failures,
// and the regular expressions cost more than the rest of reading a record.
type fingerprintCache struct {
	mu sync.Mutex
	m  map[fingerprintKey]string
}

// maxCachedFingerprints bounds the cache; it starts over when full.
const maxCachedFingerprints = 4096

var fingerprints = &fingerprintCache{m: map[fingerprintKey]string{}}

func (c *fingerprintCache) get(k fingerprintKey) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fp, ok := c.m[k]
	return fp, ok
}

func (c *fingerprintCache) put(k fingerprintKey, fp string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxCachedFingerprints {
		clear(c.m)
	}
	c.m[k] = fp
}
