package amqp

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	hdr "github.com/sluice-go/sluice/internal/headers"
)

// Marshaler converts between Watermill messages and AMQP. It implements watermill-amqp's
// Marshaler interface. Unlike watermill-amqp's DefaultMarshaler it never fails, so a
// header can never cause a nack loop. The rule for headers:
//
//   - a string header becomes metadata as it is;
//   - any other header (integers, booleans, floats, decimals, timestamps, byte arrays,
//     tables, arrays) becomes metadata in a text form — decimal numbers, "true"/"false",
//     "value/scale" decimals, RFC 3339 times (Unix seconds for a year outside 0–9999),
//     base64 bytes, JSON for tables and arrays — and its AMQP type is recorded in the
//     hdr.HeaderTypes, so a republished copy carries the same type again.
//     A value a step rewrote so that it no longer fits that type is widened (an int8
//     header set to "300" goes out as int64) or, when it is not a number at all, sent as a
//     string; so is
//     a NaN or infinite float, which RabbitMQ cannot parse (it closes the connection). Inside
//     tables and arrays only JSON's types survive: nested integers come back as int64,
//     nested bytes, times and decimals as their text, and invalid UTF-8 as U+FFFD;
//   - headers RabbitMQ owns (x-death and the like) are readable as metadata but never
//     republished;
//   - a header named like one of the property and delivery keys above, or starting with
//     "amqp-header:", is metadata under that prefix plus its name, so it neither turns
//     into a property on the next publish nor is overwritten by one;
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
// in x-dropped-headers: metadata keys longer than 255 bytes, property values longer
// than 255 bytes, and — while the content header would exceed FrameMax — the largest
// headers, those that sluice itself writes (sluice.Header*) last. A producer can send a
// message whose headers nearly fill frame_max; this is how its retry and dead-letter
// copies, which add sluice's headers, still get through.
type Marshaler struct {
	// FrameMax is the connection's negotiated frame_max. Zero means 131072.
	FrameMax int
}

// Marshal builds the publishing for msg. It never fails; see Marshaler for what it leaves
// out so that RabbitMQ accepts the result.
func (m Marshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
	types := headerTypes(msg.Metadata.Get(hdr.HeaderTypes))
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
		case hdr.ContentEncoding:
			pub.ContentEncoding = shortstr(k, v)
			continue
		case MetadataCorrelationID:
			pub.CorrelationId = shortstr(k, v)
			continue
		case hdr.ReplyTo:
			pub.ReplyTo = shortstr(k, v)
			continue
		case MetadataType:
			pub.Type = shortstr(k, v)
			continue
		case hdr.AppID:
			pub.AppId = shortstr(k, v)
			continue
		case hdr.Priority:
			if p, err := strconv.ParseUint(v, 10, 8); err == nil {
				pub.Priority = uint8(p)
			}
			continue
		case hdr.DeliveryMode:
			if v == "1" {
				pub.DeliveryMode = amqp.Transient
			}
			continue
		case hdr.Timestamp:
			if t, ok := parseTimestamp(v); ok {
				pub.Timestamp = t
			}
			continue
		}
		if hdr.ReadOnly(k) || hdr.BrokerOwned(k) || k == hdr.UUID || k == hdr.Dropped {
			continue
		}
		name, _ := hdr.HeaderName(k) // every key it refuses was handled above
		if len(name) > maxShortstr {
			dropped = append(dropped, name)
			continue
		}
		headers[name] = restoreHeader(v, types[typeKey(k)])
	}
	headers[hdr.UUID] = msg.UUID
	if pub.Timestamp.IsZero() {
		pub.Timestamp = time.Now().UTC().Truncate(time.Second)
	}
	pub.Headers = headers
	m.fit(&pub, msg.Metadata.Get(hdr.Dropped), dropped)
	return pub, nil
}

// headerTypes reads the header-type record raw. Only a foreign producer's typed headers
// have one, so without it no map is made: a nil map reads as every header a string.
func headerTypes(raw string) map[string]string {
	if raw == "" {
		return nil
	}
	types := map[string]string{}
	_ = json.Unmarshal([]byte(raw), &types) // unreadable types: send strings
	return types
}

// metadataSize is about how many metadata entries unmarshal makes of d: a map sized for
// more costs a larger table (one of up to eight entries is a single group), and one sized
// for fewer grows while it is filled. The id header, which sluice's messages carry and
// metadata does not keep, leaves room for the header-type record.
func metadataSize(d *amqp.Delivery) int {
	n := len(d.Headers)
	for _, s := range [...]string{d.ContentType, d.ContentEncoding, d.CorrelationId, d.ReplyTo,
		d.Type, d.AppId, d.MessageId, d.RoutingKey, d.Exchange} {
		if s != "" {
			n++
		}
	}
	for _, set := range [...]bool{d.Priority != 0, d.DeliveryMode != 0, !d.Timestamp.IsZero(), d.Redelivered} {
		if set {
			n++
		}
	}
	return n
}

// Unmarshal builds a Watermill message from a delivery. It never fails.
func (Marshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	return unmarshal(d), nil
}

func unmarshal(d amqp.Delivery) *message.Message {
	id := ""
	if v, ok := d.Headers[hdr.UUID].(string); ok && v != "" && len(v) <= maxShortstr {
		id = v
	} else if d.MessageId != "" {
		id = d.MessageId
	} else {
		id = watermill.NewUUID()
	}
	msg := message.NewMessage(id, d.Body)
	md := make(message.Metadata, metadataSize(&d))
	var types map[string]string // only foreign producers send typed headers
	for name, v := range d.Headers {
		if name == hdr.UUID {
			continue
		}
		k := headerKey(name)
		if s, ok := v.(string); ok {
			md[k] = s
			continue
		}
		text, typ := headerText(v)
		md[k] = text
		if !hdr.BrokerOwned(name) {
			if types == nil {
				types = make(map[string]string)
			}
			types[typeKey(k)] = typ
		}
	}
	if len(types) > 0 {
		b, _ := json.Marshal(types)
		md[hdr.HeaderTypes] = string(b)
	}
	setIf := func(k, v string) {
		if v != "" {
			md[k] = v
		}
	}
	setIf(MetadataContentType, d.ContentType)
	setIf(hdr.ContentEncoding, d.ContentEncoding)
	setIf(MetadataCorrelationID, d.CorrelationId)
	setIf(hdr.ReplyTo, d.ReplyTo)
	setIf(MetadataType, d.Type)
	setIf(hdr.AppID, d.AppId)
	setIf(hdr.MessageID, d.MessageId)
	setIf(MetadataRoutingKey, d.RoutingKey)
	setIf(MetadataExchange, d.Exchange)
	if d.Priority != 0 {
		md[hdr.Priority] = strconv.Itoa(int(d.Priority))
	}
	if d.DeliveryMode != 0 {
		md[hdr.DeliveryMode] = strconv.Itoa(int(d.DeliveryMode))
	}
	if !d.Timestamp.IsZero() {
		md[hdr.Timestamp] = timestampText(d.Timestamp)
	}
	if d.Redelivered {
		md[MetadataRedelivered] = "true"
	}
	msg.Metadata = md
	return msg
}
