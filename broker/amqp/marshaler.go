package amqp

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/failure"
)

// Metadata keys that carry AMQP properties. The marshaler fills them on consume and turns
// them back into properties on publish, so a republished copy (retry, DLQ, replay) keeps the
// producer's properties. The content type uses the conventional "content-type" key, so a
// handler that sets it on its output (as Watermill users do) gets the AMQP property.
const (
	MetadataContentType     = "content-type"
	MetadataContentEncoding = "amqp-content-encoding"
	MetadataCorrelationID   = "amqp-correlation-id"
	MetadataReplyTo         = "amqp-reply-to"
	MetadataType            = "amqp-type"
	MetadataAppID           = "amqp-app-id"
	MetadataPriority        = "amqp-priority"
	MetadataDeliveryMode    = "amqp-delivery-mode"
	MetadataTimestamp       = "amqp-timestamp"
	MetadataMessageID       = "amqp-message-id"
	// MetadataRoutingKey and MetadataExchange say where the delivery came from; read-only.
	MetadataRoutingKey = "amqp-routing-key"
	MetadataExchange   = "amqp-exchange"
	// MetadataRedelivered is "true" when RabbitMQ delivered the message before; read-only.
	MetadataRedelivered = "amqp-redelivered"

	// MetadataHeaderTypes records the AMQP type of every header that was not a string, as
	// a JSON object from the header's metadata key to type name, so Marshal can restore it.
	MetadataHeaderTypes = "sluice-header-types"

	// UUIDHeader is Watermill's message id header, kept for interoperability.
	UUIDHeader = "_watermill_message_uuid"

	// HeaderDroppedHeaders lists, comma-separated, the headers and properties Marshal had
	// to leave out because AMQP cannot carry them (see Marshaler).
	HeaderDroppedHeaders = "x-dropped-headers"

	// MetadataHeaderPrefix keeps a producer's header whose name is taken by one of the
	// metadata keys above (a header called "content-type", say, beside the content-type
	// property) or itself starts with this prefix: it is metadata MetadataHeaderPrefix+name,
	// and Marshal publishes that key as the header name again. See HeaderName.
	MetadataHeaderPrefix = "amqp-header:"
)

// Limits of the AMQP encoding that Marshal keeps to.
const (
	// DefaultFrameMax is RabbitMQ's default frame_max, the Marshaler's when FrameMax is 0.
	DefaultFrameMax = 131072
	// minFrameMax is AMQP 0-9-1's frame-min-size: every peer accepts frames this large.
	minFrameMax = 4096
	// maxShortstr is the longest AMQP short string: property values and table keys.
	maxShortstr = 255
	// frameOverhead is a frame's type, channel, size and end octets; RabbitMQ refuses a
	// frame whose payload exceeds frame_max minus this.
	frameOverhead = 8
	// headerFrameFixed is a content header's class, weight, body size and property flags.
	headerFrameFixed = 14
	// maxDroppedList bounds HeaderDroppedHeaders.
	maxDroppedList = 1024
	// maxDroppedName bounds one name in HeaderDroppedHeaders.
	maxDroppedName = 64
)

// readOnlyMetadata are filled on consume and never published as headers.
var readOnlyMetadata = map[string]bool{
	MetadataRoutingKey:  true,
	MetadataExchange:    true,
	MetadataRedelivered: true,
	MetadataHeaderTypes: true,
	MetadataMessageID:   true,
}

// reservedMetadataKey reports whether key has a meaning of its own to the marshaler, so
// that a header of that name must live in metadata under MetadataHeaderPrefix.
func reservedMetadataKey(key string) bool {
	switch key {
	case MetadataContentType, MetadataContentEncoding, MetadataCorrelationID, MetadataReplyTo,
		MetadataType, MetadataAppID, MetadataPriority, MetadataDeliveryMode, MetadataTimestamp:
		return true // the properties Marshal publishes
	}
	return readOnlyMetadata[key] || strings.HasPrefix(key, MetadataHeaderPrefix)
}

// headerKey is the metadata key Unmarshal gives the header called name.
func headerKey(name string) string {
	if reservedMetadataKey(name) {
		return MetadataHeaderPrefix + name
	}
	return name
}

// HeaderName returns the AMQP header that metadata key stands for: the key itself, or the
// name a MetadataHeaderPrefix key holds. ok is false for the keys that carry properties
// and delivery facts (MetadataContentType … MetadataRedelivered, MetadataHeaderTypes).
func HeaderName(key string) (name string, ok bool) {
	if rest, found := strings.CutPrefix(key, MetadataHeaderPrefix); found {
		if reservedMetadataKey(rest) {
			return rest, true
		}
		return key, true // not one Unmarshal makes: a header of that very name
	}
	if reservedMetadataKey(key) {
		return "", false
	}
	return key, true
}

// BrokerOwnedHeader reports whether RabbitMQ owns a header: sluice reads it and never
// writes it back, so dead-lettering records do not pile up from retry to retry.
func BrokerOwnedHeader(key string) bool {
	switch key {
	case "x-death", "x-delivery-count", "x-received-from":
		return true
	}
	return strings.HasPrefix(key, "x-first-death-") || strings.HasPrefix(key, "x-last-death-")
}

// Marshaler converts between Watermill messages and AMQP. It implements watermill-amqp's
// Marshaler interface. Unlike watermill-amqp's DefaultMarshaler it never fails, so a
// header can never cause a nack loop. The rule for headers:
//
//   - a string header becomes metadata as it is;
//   - any other header (integers, booleans, floats, decimals, timestamps, byte arrays,
//     tables, arrays) becomes metadata in a text form — decimal numbers, "true"/"false",
//     "value/scale" decimals, RFC 3339 times (Unix seconds for a year outside 0–9999),
//     base64 bytes, JSON for tables and arrays — and its AMQP type is recorded in
//     MetadataHeaderTypes, so a republished copy carries the same type again. A value a
//     step rewrote so that it no longer fits that type is widened (an int8 header set to
//     "300" goes out as int64) or, when it is not a number at all, sent as a string; so is
//     a NaN or infinite float, which RabbitMQ cannot parse (it closes the connection). Inside
//     tables and arrays only JSON's types survive: nested integers come back as int64,
//     nested bytes, times and decimals as their text, and invalid UTF-8 as U+FFFD;
//   - headers RabbitMQ owns (see BrokerOwnedHeader) are readable as metadata but never
//     republished;
//   - a header named like one of the property and delivery keys above, or starting with
//     MetadataHeaderPrefix, is metadata under MetadataHeaderPrefix plus its name, so it
//     neither turns into a property on the next publish nor is overwritten by one;
//   - the message id is Watermill's _watermill_message_uuid header when it is a non-empty
//     string of at most 255 bytes (what fits AMQP's message-id property), else the AMQP
//     message-id property, else a new UUID (then a redelivery gets another id).
//
// AMQP properties travel in the amqp-* metadata keys above. Expiration and user-id are not
// carried: a per-message TTL would expire a delayed copy inside the delay cascade, and
// RabbitMQ rejects a user-id that is not the publishing connection's user.
//
// Marshal always returns a publishing RabbitMQ accepts, because one it refuses (a header
// frame over frame_max, a short string over 255 bytes) closes the publishing connection,
// and the hand-off would close it again on every redelivery. So it leaves out, and names
// in HeaderDroppedHeaders: metadata keys longer than 255 bytes, property values longer
// than 255 bytes, and — while the content header would exceed FrameMax — the largest
// headers, those that sluice itself writes (sluice.Header*) last. A producer can send a
// message whose headers nearly fill frame_max; this is how its retry and dead-letter
// copies, which add sluice's headers, still get through.
type Marshaler struct {
	// FrameMax is the connection's negotiated frame_max. Zero means DefaultFrameMax.
	FrameMax int
}

// Marshal builds the publishing for msg. It never fails; see Marshaler for what it leaves
// out so that RabbitMQ accepts the result.
func (m Marshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
	types := map[string]string{}
	if raw := msg.Metadata.Get(MetadataHeaderTypes); raw != "" {
		_ = json.Unmarshal([]byte(raw), &types) // unreadable types: send strings
	}
	headers := make(amqp.Table, len(msg.Metadata)+1)
	pub := amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		Body:         msg.Payload,
	}
	var dropped []string
	// shortstr keeps a property only if AMQP can carry it.
	shortstr := func(key, v string) string {
		if len(v) > maxShortstr {
			dropped = append(dropped, key)
			return ""
		}
		return v
	}
	if len(msg.UUID) <= maxShortstr {
		pub.MessageId = msg.UUID
	}
	for k, v := range msg.Metadata {
		switch k {
		case MetadataContentType:
			pub.ContentType = shortstr(k, v)
			continue
		case MetadataContentEncoding:
			pub.ContentEncoding = shortstr(k, v)
			continue
		case MetadataCorrelationID:
			pub.CorrelationId = shortstr(k, v)
			continue
		case MetadataReplyTo:
			pub.ReplyTo = shortstr(k, v)
			continue
		case MetadataType:
			pub.Type = shortstr(k, v)
			continue
		case MetadataAppID:
			pub.AppId = shortstr(k, v)
			continue
		case MetadataPriority:
			if p, err := strconv.ParseUint(v, 10, 8); err == nil {
				pub.Priority = uint8(p)
			}
			continue
		case MetadataDeliveryMode:
			if v == "1" {
				pub.DeliveryMode = amqp.Transient
			}
			continue
		case MetadataTimestamp:
			if t, ok := parseTimestamp(v); ok {
				pub.Timestamp = t
			}
			continue
		}
		if readOnlyMetadata[k] || BrokerOwnedHeader(k) || k == UUIDHeader || k == HeaderDroppedHeaders {
			continue
		}
		name, _ := HeaderName(k) // every key it refuses was handled above
		if len(name) > maxShortstr {
			dropped = append(dropped, name)
			continue
		}
		headers[name] = restoreHeader(v, types[typeKey(k)])
	}
	headers[UUIDHeader] = msg.UUID
	if pub.Timestamp.IsZero() {
		pub.Timestamp = time.Now().UTC().Truncate(time.Second)
	}
	pub.Headers = headers
	m.fit(&pub, msg.Metadata.Get(HeaderDroppedHeaders), dropped)
	return pub, nil
}

// fit drops the largest headers until pub's content header fits in one frame, and records
// what was dropped (here or, in previous, by an earlier copy) in HeaderDroppedHeaders.
func (m Marshaler) fit(pub *amqp.Publishing, previous string, dropped []string) {
	frameMax := m.FrameMax
	if frameMax <= 0 {
		frameMax = DefaultFrameMax
	}
	limit := frameMax - frameOverhead
	// Room for the record of what was dropped, which is itself bounded.
	reserve := 1 + len(HeaderDroppedHeaders) + fieldSize(strings.Repeat("x", maxDroppedList))
	if headerFrameSize(*pub) > limit-reserve {
		keys := make([]string, 0, len(pub.Headers))
		for k := range pub.Headers {
			if k != UUIDHeader {
				keys = append(keys, k)
			}
		}
		// Producer headers first, sluice's own last; within each, the largest first.
		sort.Slice(keys, func(i, j int) bool {
			oi, oj := sluiceHeaders[keys[i]], sluiceHeaders[keys[j]]
			if oi != oj {
				return oj
			}
			si, sj := entrySize(keys[i], pub.Headers[keys[i]]), entrySize(keys[j], pub.Headers[keys[j]])
			if si != sj {
				return si > sj
			}
			return keys[i] < keys[j]
		})
		size := headerFrameSize(*pub)
		for _, k := range keys {
			if size <= limit-reserve {
				break
			}
			size -= entrySize(k, pub.Headers[k])
			delete(pub.Headers, k)
			dropped = append(dropped, k)
		}
		if size > limit-reserve {
			// Only the id is left and it alone is too large (a frame_max near the AMQP
			// minimum): the id still travels as the message-id property when it fits.
			delete(pub.Headers, UUIDHeader)
			dropped = append(dropped, UUIDHeader)
		}
	}
	if len(dropped) == 0 && previous == "" {
		return
	}
	names := make([]string, 0, len(dropped)+1)
	if previous != "" {
		names = append(names, previous)
	}
	for _, k := range dropped {
		names = append(names, failure.Truncate(k, maxDroppedName))
	}
	pub.Headers[HeaderDroppedHeaders] = failure.Truncate(strings.Join(names, ","), maxDroppedList)
}

// sluiceHeaders are the headers sluice writes; Marshal drops them only after every other.
var sluiceHeaders = map[string]bool{
	HeaderDroppedHeaders:          true,
	sluice.HeaderRetryCount:       true,
	sluice.HeaderFirstFailureTime: true,
	sluice.HeaderLastFailureTime:  true,
	sluice.HeaderLastError:        true,
	sluice.HeaderLastErrorMessage: true,
	sluice.HeaderOriginalQueue:    true,
	sluice.HeaderRetryHistory:     true,
	sluice.HeaderDeferCount:       true,
	sluice.HeaderFirstDeferTime:   true,
	sluice.HeaderIdempotencyKey:   true,
	sluice.HeaderErrorType:        true,
	sluice.HeaderErrorMessage:     true,
	sluice.HeaderErrorStack:       true,
	sluice.HeaderHandler:          true,
	sluice.HeaderFailedAt:         true,
	sluice.HeaderFailedHost:       true,
	sluice.HeaderFailedPID:        true,
	sluice.HeaderErrorClass:       true,
	sluice.HeaderReplayCount:      true,
	sluice.HeaderTraceParent:      true,
	sluice.HeaderTraceState:       true,
}

// headerFrameSize is the payload size of the content header frame amqp091 writes for pub.
func headerFrameSize(pub amqp.Publishing) int {
	n := headerFrameFixed
	for _, s := range []string{pub.ContentType, pub.ContentEncoding, pub.CorrelationId, pub.ReplyTo,
		pub.Expiration, pub.MessageId, pub.Type, pub.UserId, pub.AppId} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	if len(pub.Headers) > 0 {
		n += tableSize(pub.Headers)
	}
	if pub.DeliveryMode > 0 {
		n++
	}
	if pub.Priority > 0 {
		n++
	}
	if !pub.Timestamp.IsZero() {
		n += 8
	}
	return n
}

// tableSize is the encoded size of a field table: its length and its entries.
func tableSize(t amqp.Table) int {
	n := 4
	for k, v := range t {
		n += entrySize(k, v)
	}
	return n
}

func entrySize(k string, v any) int { return 1 + len(k) + fieldSize(v) }

// fieldSize is the encoded size of a field value: its type octet and its value.
func fieldSize(v any) int {
	switch x := v.(type) {
	case nil:
		return 1
	case bool, uint8, int8:
		return 2
	case int16, uint16:
		return 3
	case int, int32, uint32, float32:
		return 5
	case amqp.Decimal:
		return 6
	case int64, float64, time.Time:
		return 9
	case string:
		return 5 + len(x)
	case []byte:
		return 5 + len(x)
	case []any:
		n := 5
		for _, e := range x {
			n += fieldSize(e)
		}
		return n
	case amqp.Table:
		return 1 + tableSize(x)
	default:
		return 0 // not a field amqp091 can write; restoreHeader never makes one
	}
}

// Unmarshal builds a Watermill message from a delivery. It never fails.
func (Marshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	return unmarshal(d), nil
}

func unmarshal(d amqp.Delivery) *message.Message {
	id := ""
	if v, ok := d.Headers[UUIDHeader].(string); ok && v != "" && len(v) <= maxShortstr {
		id = v
	} else if d.MessageId != "" {
		id = d.MessageId
	} else {
		id = watermill.NewUUID()
	}
	msg := message.NewMessage(id, d.Body)
	md := make(message.Metadata, len(d.Headers)+8)
	var types map[string]string // only foreign producers send typed headers
	for name, v := range d.Headers {
		if name == UUIDHeader {
			continue
		}
		k := headerKey(name)
		if s, ok := v.(string); ok {
			md[k] = s
			continue
		}
		text, typ := headerText(v)
		md[k] = text
		if !BrokerOwnedHeader(name) {
			if types == nil {
				types = make(map[string]string)
			}
			types[typeKey(k)] = typ
		}
	}
	if len(types) > 0 {
		b, _ := json.Marshal(types)
		md[MetadataHeaderTypes] = string(b)
	}
	setIf := func(k, v string) {
		if v != "" {
			md[k] = v
		}
	}
	setIf(MetadataContentType, d.ContentType)
	setIf(MetadataContentEncoding, d.ContentEncoding)
	setIf(MetadataCorrelationID, d.CorrelationId)
	setIf(MetadataReplyTo, d.ReplyTo)
	setIf(MetadataType, d.Type)
	setIf(MetadataAppID, d.AppId)
	setIf(MetadataMessageID, d.MessageId)
	setIf(MetadataRoutingKey, d.RoutingKey)
	setIf(MetadataExchange, d.Exchange)
	if d.Priority != 0 {
		md[MetadataPriority] = strconv.Itoa(int(d.Priority))
	}
	if d.DeliveryMode != 0 {
		md[MetadataDeliveryMode] = strconv.Itoa(int(d.DeliveryMode))
	}
	if !d.Timestamp.IsZero() {
		md[MetadataTimestamp] = timestampText(d.Timestamp)
	}
	if d.Redelivered {
		md[MetadataRedelivered] = "true"
	}
	msg.Metadata = md
	return msg
}

// typeKey is a header's name in the MetadataHeaderTypes record. That record is JSON, which
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
	return t.UTC().Format(time.RFC3339)
}

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
