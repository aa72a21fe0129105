package amqp_test

import (
	"encoding/binary"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/headers"
	hdr "github.com/sluice-go/sluice/internal/headers"
)

// tableGen builds AMQP header tables from fuzz bytes: every field type amqp091 reads from
// the wire (so no Go int, which amqp091 writes as int32), nested tables and arrays up to a
// small depth, and keys drawn from the names the marshaler treats specially.
type tableGen struct{ b []byte }

func (g *tableGen) byte() byte {
	if len(g.b) == 0 {
		return 0
	}
	c := g.b[0]
	g.b = g.b[1:]
	return c
}

func (g *tableGen) bytes(n int) []byte {
	n = min(n, len(g.b))
	out := append([]byte(nil), g.b[:n]...)
	g.b = g.b[n:]
	return out
}

func (g *tableGen) uint64() uint64 {
	var buf [8]byte
	copy(buf[:], g.bytes(8))
	return binary.BigEndian.Uint64(buf[:])
}

// str returns up to 255 bytes, or with a marker byte a long string (a header value is a
// long string: RabbitMQ bounds it only by frame_max).
func (g *tableGen) str() string {
	n := int(g.byte())
	if n == 255 {
		n = int(g.byte())<<8 | int(g.byte())
	}
	return string(g.bytes(n))
}

// specialKeys are names the marshaler reads differently from other headers.
var specialKeys = []string{
	hdr.UUID, hdr.HeaderTypes, hdr.Dropped,
	"x-death", "x-first-death-queue", "x-last-death-reason", "x-delivery-count", "x-received-from",
	amqp.MetadataContentType, amqp.MetadataMessageID, amqp.MetadataPriority, amqp.MetadataTimestamp,
	amqp.MetadataRoutingKey, amqp.MetadataDeliveryMode,
	sluice.HeaderRetryCount, sluice.HeaderRetryHistory, headers.TraceParent, "",
	// Appended, so that the saved corpus keeps naming the keys it was written with.
	amqp.MetadataExchange, amqp.MetadataType,
	hdr.MetadataPrefix + "x", hdr.MetadataPrefix + amqp.MetadataContentType,
}

func (g *tableGen) key() string {
	c := g.byte()
	switch {
	case c >= 0xE0:
		return specialKeys[int(c-0xE0)%len(specialKeys)]
	case c == 0xDF:
		return string(g.bytes(int(g.byte()))) // up to 255 bytes: a short string
	default:
		return string(g.bytes(int(c)))
	}
}

func (g *tableGen) value(depth int) any {
	kind := g.byte() % 17
	if depth >= 3 && (kind == 15 || kind == 16) {
		kind = 12
	}
	switch kind {
	case 0:
		return nil
	case 1:
		return g.byte()&1 == 1
	case 2:
		return int8(g.byte())
	case 3:
		return g.byte() // uint8, 'B'
	case 4:
		return int16(g.uint64())
	case 5:
		return uint16(g.uint64())
	case 6:
		return int32(g.uint64())
	case 7:
		return uint32(g.uint64())
	case 8:
		return int64(g.uint64())
	case 9:
		return math.Float32frombits(uint32(g.uint64()))
	case 10:
		return math.Float64frombits(g.uint64())
	case 11:
		return amqp091.Decimal{Scale: g.byte(), Value: int32(g.uint64())}
	case 12:
		return g.str()
	case 13:
		return []byte(g.str())
	case 14:
		return time.Unix(int64(g.uint64()), 0) // as amqp091 reads a timestamp
	case 15:
		return g.table(depth + 1)
	default:
		n := int(g.byte() % 5)
		arr := make([]any, n)
		for i := range arr {
			arr[i] = g.value(depth + 1)
		}
		return arr
	}
}

func (g *tableGen) table(depth int) amqp091.Table {
	n := int(g.byte() % 9)
	t := make(amqp091.Table, n)
	for range n {
		t[g.key()] = g.value(depth)
	}
	return t
}

func shortstr(s string) string {
	if len(s) > 255 {
		return s[:255]
	}
	return s
}

// FuzzMarshalerHeaders feeds the marshaler arbitrary header tables and properties, as any
// producer can send them, and checks that Unmarshal never fails, that Marshal of the
// result is a publishing RabbitMQ accepts (valid field types, short strings within 255
// bytes, a content header within frame_max), that every header of the producer comes back (whatever its name: one named like a
// property key stays a header), strings identical and
// typed ones with their type (and value, for scalars), and that the metadata text is a
// fixed point after one republish, so every attempt of a message reads the same headers.
func FuzzMarshalerHeaders(f *testing.F) {
	f.Add([]byte{}, "", "", uint8(0), uint8(0), int64(0))
	f.Add([]byte{3, 1, 'a', 12, 1, 'b', 0xE0, 12, 2, 'i', 'd', 0xE3, 16, 2, 15, 1, 1, 'c', 8, 0, 0, 0, 0, 0, 0, 0, 7, 0},
		"application/json", "m-1", uint8(5), uint8(1), int64(1714557600))
	f.Add([]byte{8, 1, 'a', 2, 0x80, 1, 'b', 3, 0xff, 1, 'c', 4, 0x80, 0, 1, 'd', 5, 0xff, 0xff, 1, 'e', 6, 0x80, 0, 0, 0,
		1, 'f', 7, 0xff, 0xff, 0xff, 0xff, 1, 'g', 9, 0x7f, 0xc0, 0, 0, 1, 'h', 10, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0},
		"", "", uint8(0), uint8(2), int64(-62135596801))
	f.Add([]byte{2, 1, 'x', 11, 2, 0x80, 0, 0, 0, 1, 't', 14, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"text/plain", strings.Repeat("i", 255), uint8(9), uint8(1), int64(1<<40))
	f.Add([]byte{1, 0xE2, 15, 2, 0xE5, 12, 3, 'a', 'b', 'c', 0xff, 16, 3, 13, 2, 0xff, 0xfe, 0, 12, 1, 0xc3},
		"", "", uint8(0), uint8(0), int64(0))
	f.Fuzz(func(t *testing.T, data []byte, contentType, messageID string, priority, deliveryMode uint8, ts int64) {
		g := &tableGen{b: data}
		headers := g.table(0)
		d := amqp091.Delivery{
			Headers:      headers,
			ContentType:  shortstr(contentType),
			MessageId:    shortstr(messageID),
			Priority:     priority,
			DeliveryMode: deliveryMode,
			Timestamp:    time.Unix(ts, 0),
			Body:         data,
		}
		msg, err := amqp.Marshaler{}.Unmarshal(d)
		if err != nil || msg == nil {
			t.Fatalf("Unmarshal failed: %v", err)
		}
		checkID(t, d, msg.UUID)

		pub, err := amqp.Marshaler{}.Marshal(msg)
		if err != nil {
			t.Fatalf("Marshal failed: %v", err)
		}
		checkPublishable(t, pub)

		dropped := map[string]bool{}
		if list, ok := pub.Headers[hdr.Dropped].(string); ok {
			for _, k := range strings.Split(list, ",") {
				dropped[k] = true
			}
		}
		for k, in := range headers {
			if k == hdr.UUID || k == hdr.Dropped || dropped[k] {
				continue
			}
			out, present := pub.Headers[k]
			if hdr.BrokerOwned(k) {
				if present {
					t.Fatalf("broker-owned header %q republished", k)
				}
				continue
			}
			if !present {
				t.Fatalf("header %q (%T) not republished and not listed as dropped", k, in)
			}
			checkSameHeader(t, k, in, out)
		}
		checkProperties(t, d, pub)
		// The type record is the marshaler's own; only a producer's header of that name travels.
		_, sentRecord := headers[hdr.HeaderTypes]
		noRecord := func(p amqp091.Publishing) {
			if _, ok := p.Headers[hdr.HeaderTypes]; ok && !sentRecord {
				t.Fatal("the header type record was published")
			}
		}
		noRecord(pub)

		// One republish normalises the text form; after that it must not change again.
		msg2, _ := amqp.Marshaler{}.Unmarshal(deliveryOf(pub))
		pub2, _ := amqp.Marshaler{}.Marshal(msg2)
		checkPublishable(t, pub2)
		noRecord(pub2)
		msg3, _ := amqp.Marshaler{}.Unmarshal(deliveryOf(pub2))
		if msg3.UUID != msg2.UUID || msg2.UUID != msg.UUID {
			t.Fatalf("id changed across republishes: %q, %q, %q", msg.UUID, msg2.UUID, msg3.UUID)
		}
		for k, v := range msg2.Metadata {
			if got := msg3.Metadata[k]; got != v {
				t.Fatalf("metadata %q changed on the second republish: %q -> %q", k, v, got)
			}
		}
	})
}

func checkID(t *testing.T, d amqp091.Delivery, id string) {
	t.Helper()
	want := ""
	if h, ok := d.Headers[hdr.UUID].(string); ok && h != "" && len(h) <= 255 {
		want = h
	} else if d.MessageId != "" {
		want = d.MessageId
	}
	switch {
	case want != "" && id != want:
		t.Fatalf("message id %q, want %q", id, want)
	case id == "":
		t.Fatal("message has no id")
	}
}

func checkPublishable(t *testing.T, pub amqp091.Publishing) {
	t.Helper()
	if err := pub.Headers.Validate(); err != nil {
		t.Fatalf("published headers are not valid AMQP: %v", err)
	}
	if n := encodedHeaderFrame(t, pub); n > amqp.DefaultFrameMax-8 {
		t.Fatalf("content header of %d bytes exceeds frame_max %d", n, amqp.DefaultFrameMax)
	}
	for _, s := range []string{pub.ContentType, pub.ContentEncoding, pub.CorrelationId, pub.ReplyTo,
		pub.Expiration, pub.MessageId, pub.Type, pub.UserId, pub.AppId} {
		if len(s) > 255 {
			t.Fatalf("property of %d bytes exceeds a short string", len(s))
		}
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case amqp091.Table:
			for k, e := range x {
				if len(k) > 255 {
					t.Fatalf("table key of %d bytes exceeds a short string", len(k))
				}
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(pub.Headers)
}

// checkSameHeader compares a republished top-level header with what the producer sent.
func checkSameHeader(t *testing.T, k string, in, out any) {
	t.Helper()
	// RabbitMQ never delivers a NaN or infinite float (it refuses them), and the
	// marshaler never publishes one: it goes out as its text.
	if f, ok := asFloat(in); ok && (math.IsNaN(f) || math.IsInf(f, 0)) {
		if _, isString := out.(string); !isString {
			t.Fatalf("header %q: non-finite %v republished as %T, want its text", k, in, out)
		}
		return
	}
	if reflect.TypeOf(in) != reflect.TypeOf(out) {
		t.Fatalf("header %q sent as %T came back as %T (%v)", k, in, out, out)
	}
	switch x := in.(type) {
	case amqp091.Table, []any:
		return // nested values keep only JSON's types (documented)
	case float32, float64:
		if in != out {
			t.Fatalf("header %q: %v came back as %v", k, x, out)
		}
	case time.Time:
		if y := out.(time.Time); x.Unix() != y.Unix() {
			t.Fatalf("header %q: timestamp %d came back as %d", k, x.Unix(), y.Unix())
		}
	default:
		if !reflect.DeepEqual(in, out) {
			t.Fatalf("header %q: %#v came back as %#v", k, in, out)
		}
	}
}

func checkProperties(t *testing.T, d amqp091.Delivery, pub amqp091.Publishing) {
	t.Helper()
	if pub.ContentType != d.ContentType || pub.Priority != d.Priority {
		t.Fatalf("properties changed: content type %q -> %q, priority %d -> %d", d.ContentType, pub.ContentType, d.Priority, pub.Priority)
	}
	wantMode := amqp091.Persistent
	if d.DeliveryMode == amqp091.Transient {
		wantMode = amqp091.Transient
	}
	if pub.DeliveryMode != wantMode {
		t.Fatalf("delivery mode %d republished as %d, want %d", d.DeliveryMode, pub.DeliveryMode, wantMode)
	}
	if !d.Timestamp.IsZero() && pub.Timestamp.Unix() != d.Timestamp.Unix() {
		t.Fatalf("timestamp %d republished as %d", d.Timestamp.Unix(), pub.Timestamp.Unix())
	}
}

func asFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// deliveryOf is what a consumer receives for pub.
func deliveryOf(pub amqp091.Publishing) amqp091.Delivery {
	return amqp091.Delivery{
		Headers: pub.Headers, ContentType: pub.ContentType, ContentEncoding: pub.ContentEncoding,
		DeliveryMode: pub.DeliveryMode, Priority: pub.Priority, CorrelationId: pub.CorrelationId,
		ReplyTo: pub.ReplyTo, MessageId: pub.MessageId, Timestamp: pub.Timestamp, Type: pub.Type,
		AppId: pub.AppId, Body: pub.Body,
	}
}
