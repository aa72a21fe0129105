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

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Metadata keys that carry AMQP properties. The marshaler fills them on consume and turns
// them back into properties on publish, so a republished copy (retry, DLQ, replay) keeps the
// producer's properties.
const (
	MetadataContentType     = "amqp-content-type"
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
	// a JSON object from header name to type name, so Marshal can restore it.
	MetadataHeaderTypes = "sluice-header-types"

	// UUIDHeader is Watermill's message id header, kept for interoperability.
	UUIDHeader = "_watermill_message_uuid"
)

// readOnlyMetadata are filled on consume and never published as headers.
var readOnlyMetadata = map[string]bool{
	MetadataRoutingKey:  true,
	MetadataExchange:    true,
	MetadataRedelivered: true,
	MetadataHeaderTypes: true,
	MetadataMessageID:   true,
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
//     RFC 3339 times, base64 bytes, JSON for tables and arrays — and its AMQP type is
//     recorded in MetadataHeaderTypes, so a republished copy carries the same type again;
//   - headers RabbitMQ owns (see BrokerOwnedHeader) are readable as metadata but never
//     republished;
//   - the message id is Watermill's _watermill_message_uuid header, else the AMQP
//     message-id property, else a new UUID (then a redelivery gets another id).
//
// AMQP properties travel in the amqp-* metadata keys above. Expiration and user-id are not
// carried: a per-message TTL would expire a delayed copy inside the delay cascade, and
// RabbitMQ rejects a user-id that is not the publishing connection's user.
type Marshaler struct{}

// Marshal builds the publishing for msg.
func (Marshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
	types := map[string]string{}
	if raw := msg.Metadata.Get(MetadataHeaderTypes); raw != "" {
		_ = json.Unmarshal([]byte(raw), &types) // unreadable types: send strings
	}
	headers := make(amqp.Table, len(msg.Metadata)+1)
	pub := amqp.Publishing{
		MessageId:    msg.UUID,
		DeliveryMode: amqp.Persistent,
		Body:         msg.Payload,
	}
	for k, v := range msg.Metadata {
		switch k {
		case MetadataContentType:
			pub.ContentType = v
			continue
		case MetadataContentEncoding:
			pub.ContentEncoding = v
			continue
		case MetadataCorrelationID:
			pub.CorrelationId = v
			continue
		case MetadataReplyTo:
			pub.ReplyTo = v
			continue
		case MetadataType:
			pub.Type = v
			continue
		case MetadataAppID:
			pub.AppId = v
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
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
				pub.Timestamp = t
			}
			continue
		}
		if readOnlyMetadata[k] || BrokerOwnedHeader(k) || k == UUIDHeader {
			continue
		}
		headers[k] = restoreHeader(v, types[k])
	}
	headers[UUIDHeader] = msg.UUID
	if pub.Timestamp.IsZero() {
		pub.Timestamp = time.Now().UTC().Truncate(time.Second)
	}
	pub.Headers = headers
	return pub, nil
}

// Unmarshal builds a Watermill message from a delivery. It never fails.
func (Marshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	return unmarshal(d), nil
}

func unmarshal(d amqp.Delivery) *message.Message {
	id := ""
	if v, ok := d.Headers[UUIDHeader].(string); ok && v != "" {
		id = v
	} else if d.MessageId != "" {
		id = d.MessageId
	} else {
		id = watermill.NewUUID()
	}
	msg := message.NewMessage(id, d.Body)
	md := make(message.Metadata, len(d.Headers)+8)
	types := map[string]string{}
	for k, v := range d.Headers {
		if k == UUIDHeader || k == MetadataHeaderTypes {
			continue
		}
		if s, ok := v.(string); ok {
			md[k] = s
			continue
		}
		text, typ := headerText(v)
		md[k] = text
		if !BrokerOwnedHeader(k) {
			types[k] = typ
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
		md[MetadataTimestamp] = d.Timestamp.UTC().Format(time.RFC3339Nano)
	}
	if d.Redelivered {
		md[MetadataRedelivered] = "true"
	}
	msg.Metadata = md
	return msg
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
		return x.UTC().Format(time.RFC3339), "timestamp"
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

// restoreHeader turns metadata text back into a header of the recorded type. Text that no
// longer parses as that type (a step rewrote it) is sent as a string.
func restoreHeader(text, typ string) any {
	switch typ {
	case "", "string":
		return text
	case "void":
		return nil
	case "bool":
		if b, err := strconv.ParseBool(text); err == nil {
			return b
		}
	case "int8", "int16", "int32", "int64":
		if n, err := strconv.ParseInt(text, 10, 64); err == nil {
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
	case "uint8", "uint16", "uint32":
		if n, err := strconv.ParseUint(text, 10, 32); err == nil {
			switch typ {
			case "uint8":
				return uint8(n)
			case "uint16":
				return uint16(n)
			}
			return uint32(n)
		}
	case "float32":
		if f, err := strconv.ParseFloat(text, 32); err == nil {
			return float32(f)
		}
	case "float64":
		if f, err := strconv.ParseFloat(text, 64); err == nil {
			return f
		}
	case "decimal":
		var d amqp.Decimal
		if _, err := fmt.Sscanf(text, "%d/%d", &d.Value, &d.Scale); err == nil {
			return d
		}
	case "timestamp":
		if t, err := time.Parse(time.RFC3339, text); err == nil {
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
			t[k] = tableValue(x[k])
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
