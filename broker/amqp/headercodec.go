package amqp

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/sluice-go/sluice/internal/failure"
)

// typeKey is a header's name in the header-type record (headers.HeaderTypes). That record is JSON, which
// cannot hold invalid UTF-8 (it would become U+FFFD and no longer match the header), and
// a header name is any byte string; such a name is recorded base64-encoded.
func typeKey(k string) string {
	if utf8.ValidString(k) {
		return k
	}
	return "\ufffdbase64:" + base64.StdEncoding.EncodeToString([]byte(k))
}

// headerText returns the metadata text of a non-string header value and its type name.
func headerText(v any) (string, string) {
	switch x := v.(type) {
	case nil:
		return "", "void"
	case bool:
		return strconv.FormatBool(x), "bool"
	case int8:
		return strconv.FormatInt(int64(x), 10), "int8"
	case uint8:
		return strconv.FormatUint(uint64(x), 10), "uint8"
	case int16:
		return strconv.FormatInt(int64(x), 10), "int16"
	case uint16:
		return strconv.FormatUint(uint64(x), 10), "uint16"
	case int32:
		return strconv.FormatInt(int64(x), 10), "int32"
	case uint32:
		return strconv.FormatUint(uint64(x), 10), "uint32"
	case int:
		return strconv.FormatInt(int64(x), 10), "int64"
	case int64:
		return strconv.FormatInt(x, 10), "int64"
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32), "float32"
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), "float64"
	case amqp.Decimal:
		return fmt.Sprintf("%d/%d", x.Value, x.Scale), "decimal"
	case time.Time:
		return timestampText(x), "timestamp"
	case []byte:
		return base64.StdEncoding.EncodeToString(x), "bytes"
	case amqp.Table, []any:
		b, err := json.Marshal(jsonable(x))
		if err != nil {
			return fmt.Sprint(x), "string"
		}
		if _, ok := x.(amqp.Table); ok {
			return string(b), "table"
		}
		return string(b), "array"
	default:
		return fmt.Sprint(x), "string"
	}
}

// jsonable converts AMQP table values to values encoding/json renders faithfully.
func jsonable(v any) any {
	switch x := v.(type) {
	case amqp.Table:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = jsonable(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonable(e)
		}
		return out
	case []byte:
		return base64.StdEncoding.EncodeToString(x)
	case time.Time:
		return x.UTC().Format(time.RFC3339)
	case amqp.Decimal:
		return fmt.Sprintf("%d/%d", x.Value, x.Scale)
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return strconv.FormatFloat(x, 'g', -1, 64)
		}
		return x
	case float32:
		f := float64(x)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return strconv.FormatFloat(f, 'g', -1, 32)
		}
		return f
	default:
		return x
	}
}

// timestampText writes an AMQP timestamp (whole seconds) as RFC 3339, or as Unix seconds
// when its year has no RFC 3339 form: an AMQP timestamp is any 64-bit number of seconds.
func timestampText(t time.Time) string {
	if y := t.UTC().Year(); y < 0 || y > 9999 {
		return strconv.FormatInt(t.Unix(), 10)
	}
	// Deliveries published in the same second share the text (which depends on the
	// second alone); formatting it is an allocation per delivery. The last second's text
	// is shared without a lock: every consumer's workers pass here.
	sec := t.Unix()
	if last := lastTimestamp.Load(); last != nil && last.sec == sec {
		return last.text
	}
	text := t.UTC().Format(time.RFC3339)
	lastTimestamp.Store(&formattedSecond{sec: sec, text: text})
	return text
}

// formattedSecond is a second's RFC 3339 text.
type formattedSecond struct {
	sec  int64
	text string
}

// lastTimestamp is the last second timestampText formatted.
var lastTimestamp atomic.Pointer[formattedSecond]

// parseTimestamp reads what timestampText writes (and any RFC 3339 time a step wrote).
func parseTimestamp(text string) (time.Time, bool) {
	if t, err := time.Parse(time.RFC3339Nano, text); err == nil {
		return t, true
	}
	if sec, err := strconv.ParseInt(text, 10, 64); err == nil {
		return time.Unix(sec, 0).UTC(), true
	}
	return time.Time{}, false
}

// restoreHeader turns metadata text back into a header of the recorded type. Text that no
// longer fits that type (a step rewrote it) is widened to int64 or float64 when it is
// still a number, and sent as a string otherwise: a typed header never wraps around.
func restoreHeader(text, typ string) any {
	switch typ {
	case "", "string":
		return text
	case "void":
		if text == "" {
			return nil
		}
	case "bool":
		if b, err := strconv.ParseBool(text); err == nil {
			return b
		}
	case "int8", "int16", "int32", "int64":
		bits := map[string]int{"int8": 8, "int16": 16, "int32": 32, "int64": 64}[typ]
		if n, err := strconv.ParseInt(text, 10, bits); err == nil {
			switch typ {
			case "int8":
				return int8(n)
			case "int16":
				return int16(n)
			case "int32":
				return int32(n)
			}
			return n
		}
		return widened(text)
	case "uint8", "uint16", "uint32":
		bits := map[string]int{"uint8": 8, "uint16": 16, "uint32": 32}[typ]
		if n, err := strconv.ParseUint(text, 10, bits); err == nil {
			switch typ {
			case "uint8":
				return uint8(n)
			case "uint16":
				return uint16(n)
			}
			return uint32(n)
		}
		return widened(text)
	case "float32":
		if f, err := strconv.ParseFloat(text, 32); err == nil && finite(f) {
			return float32(f)
		}
		if f, err := strconv.ParseFloat(text, 64); err == nil && finite(f) {
			return f
		}
	case "float64":
		if f, err := strconv.ParseFloat(text, 64); err == nil && finite(f) {
			return f
		}
	case "decimal":
		if v, s, ok := strings.Cut(text, "/"); ok {
			value, verr := strconv.ParseInt(v, 10, 32)
			scale, serr := strconv.ParseUint(s, 10, 8)
			if verr == nil && serr == nil {
				return amqp.Decimal{Scale: uint8(scale), Value: int32(value)}
			}
		}
	case "timestamp":
		if t, ok := parseTimestamp(text); ok {
			return t
		}
	case "bytes":
		if b, err := base64.StdEncoding.DecodeString(text); err == nil {
			return b
		}
	case "table", "array":
		var v any
		dec := json.NewDecoder(strings.NewReader(text))
		dec.UseNumber()
		if err := dec.Decode(&v); err == nil {
			if t := tableValue(v); t != nil {
				return t
			}
		}
	}
	return text
}

// finite reports whether f is neither NaN nor infinite. RabbitMQ cannot parse a NaN or
// infinite float in a header: it closes the publishing connection (541 INTERNAL_ERROR), so
// such a value is sent as its text.
func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// widened returns integer text that does not fit its recorded type as an int64, else as a
// string.
func widened(text string) any {
	if n, err := strconv.ParseInt(text, 10, 64); err == nil {
		return n
	}
	return text
}

// tableValue converts decoded JSON to AMQP table types; numbers become int64 when integral.
func tableValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		t := make(amqp.Table, len(x))
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			// A key JSON re-encoded (invalid UTF-8 becomes U+FFFD, three bytes) may no
			// longer fit AMQP's short string; amqp091 would refuse the whole publish.
			t[failure.Truncate(k, maxShortstr)] = tableValue(x[k])
		}
		return t
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = tableValue(e)
		}
		return out
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n
		}
		if f, err := x.Float64(); err == nil {
			return f
		}
		return string(x)
	default:
		return x
	}
}
