package amqp_test

import (
	"math"
	"strings"
	"testing"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/headers"
)

// roundTrip consumes d and republishes what came out, as a retry or dead-letter hand-off
// does when no step touched the message.
func roundTrip(t *testing.T, d amqp091.Delivery) (*message.Message, amqp091.Publishing) {
	t.Helper()
	msg, err := amqp.Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	pub, err := amqp.Marshaler{}.Marshal(msg)
	require.NoError(t, err)
	require.NoError(t, pub.Headers.Validate(), "published headers must be valid AMQP")
	return msg, pub
}

func TestMarshalerHeaderValueTypesRoundTrip(t *testing.T) {
	ts := time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		value    any
		wantText string
		// want is the republished value; nil means value itself.
		want any
	}{
		{name: "string", value: "plain text", wantText: "plain text"},
		{name: "empty string", value: "", wantText: ""},
		{name: "invalid UTF-8 string", value: "\xff\xfe", wantText: "\xff\xfe"},
		{name: "bool true", value: true, wantText: "true"},
		{name: "bool false", value: false, wantText: "false"},
		{name: "int8", value: int8(-128), wantText: "-128"},
		{name: "uint8", value: uint8(255), wantText: "255"},
		{name: "int16", value: int16(-32768), wantText: "-32768"},
		{name: "uint16", value: uint16(65535), wantText: "65535"},
		{name: "int32", value: int32(math.MinInt32), wantText: "-2147483648"},
		{name: "uint32", value: uint32(math.MaxUint32), wantText: "4294967295"},
		{name: "int64", value: int64(math.MaxInt64), wantText: "9223372036854775807"},
		{name: "Go int (only in-process) goes out as int64", value: 7, wantText: "7", want: int64(7)},
		{name: "float32", value: float32(1.5), wantText: "1.5"},
		{name: "float32 smallest", value: float32(math.SmallestNonzeroFloat32), wantText: "1e-45"},
		{name: "float64", value: 0.1, wantText: "0.1"},
		{name: "float64 max", value: math.MaxFloat64, wantText: "1.7976931348623157e+308"},
		{name: "float64 -Inf goes out as text", value: math.Inf(-1), wantText: "-Inf", want: "-Inf"},
		{name: "float32 +Inf goes out as text", value: float32(math.Inf(1)), wantText: "+Inf", want: "+Inf"},
		{name: "decimal", value: amqp091.Decimal{Scale: 2, Value: -12345}, wantText: "-12345/2"},
		{name: "timestamp", value: ts, wantText: "2024-05-01T10:00:00Z"},
		{name: "timestamp in another zone", value: ts.In(time.FixedZone("x", 3600)), wantText: "2024-05-01T10:00:00Z", want: ts},
		{name: "timestamp beyond year 9999", value: time.Unix(1<<40, 0).UTC(), wantText: "1099511627776"},
		{name: "timestamp before year 0", value: time.Unix(-1<<40, 0).UTC(), wantText: "-1099511627776"},
		{name: "byte array", value: []byte{0, 1, 0xff}, wantText: "AAH/"},
		{name: "empty byte array", value: []byte{}, wantText: ""},
		{name: "void", value: nil, wantText: ""},
		{
			name:     "table",
			value:    amqp091.Table{"s": "x", "n": int64(3), "b": true, "v": nil, "t": amqp091.Table{"a": []any{"y"}}},
			wantText: `{"b":true,"n":3,"s":"x","t":{"a":["y"]},"v":null}`,
		},
		{name: "array", value: []any{"a", int64(1), false, nil, []any{}}, wantText: `["a",1,false,null,[]]`},
		{
			name:     "nested values keep JSON's types only",
			value:    amqp091.Table{"i8": int8(1), "f": 2.0, "bytes": []byte("hi"), "ts": ts, "dec": amqp091.Decimal{Scale: 1, Value: 5}, "nan": math.NaN()},
			wantText: `{"bytes":"aGk=","dec":"5/1","f":2,"i8":1,"nan":"NaN","ts":"2024-05-01T10:00:00Z"}`,
			want:     amqp091.Table{"i8": int64(1), "f": int64(2), "bytes": "aGk=", "ts": "2024-05-01T10:00:00Z", "dec": "5/1", "nan": "NaN"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, pub := roundTrip(t, amqp091.Delivery{Headers: amqp091.Table{"h": tt.value}})
			assert.Equal(t, tt.wantText, msg.Metadata.Get("h"), "metadata text")
			want := tt.want
			if want == nil {
				want = tt.value
			}
			got, ok := pub.Headers["h"]
			require.True(t, ok, "header republished")
			assert.IsType(t, want, got, "republished type")
			if wt, ok := want.(time.Time); ok {
				assert.True(t, wt.Equal(got.(time.Time)), "timestamp %v, want %v", got, wt)
				return
			}
			assert.Equal(t, want, got)
		})
	}
}

// RabbitMQ cannot parse a NaN or infinite float header: it closes the publishing connection
// with 541 INTERNAL_ERROR. A retry or dead-letter copy must never carry one, or every
// hand-off of the message would take the connection down again.
func TestMarshalerNeverPublishesNonFiniteFloats(t *testing.T) {
	for _, tt := range []struct {
		name string
		typ  any
		text string
	}{
		{name: "float64 NaN", typ: 1.0, text: "NaN"},
		{name: "float32 NaN", typ: float32(1), text: "NaN"},
		{name: "float64 +Inf", typ: 1.0, text: "+Inf"},
		{name: "float32 -Inf", typ: float32(1), text: "-Inf"},
		{name: "float32 beyond float64", typ: float32(1), text: "1e400"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := amqp.Marshaler{}.Unmarshal(amqp091.Delivery{Headers: amqp091.Table{"f": tt.typ}})
			require.NoError(t, err)
			msg.Metadata.Set("f", tt.text)
			pub, err := amqp.Marshaler{}.Marshal(msg)
			require.NoError(t, err)
			assert.Equal(t, tt.text, pub.Headers["f"])
		})
	}
}

// A step rewrites a typed header as text (the retry step writes x-retry-count with
// strconv.Itoa); the type a producer chose must come back, and never wrap around.
func TestMarshalerRewrittenTypedHeader(t *testing.T) {
	tests := []struct {
		name    string
		value   any
		rewrite string
		want    any
	}{
		{name: "int32 counter incremented", value: int32(1), rewrite: "2", want: int32(2)},
		{name: "int8 past its range widens instead of wrapping", value: int8(127), rewrite: "128", want: int64(128)},
		{name: "uint8 past its range widens", value: uint8(255), rewrite: "256", want: int64(256)},
		{name: "uint16 set negative widens", value: uint16(1), rewrite: "-1", want: int64(-1)},
		{name: "int16 beyond int64 becomes a string", value: int16(1), rewrite: "99999999999999999999", want: "99999999999999999999"},
		{name: "float32 beyond its range widens", value: float32(1), rewrite: "1e300", want: 1e300},
		{name: "int64 set to text becomes a string", value: int64(1), rewrite: "abc", want: "abc"},
		{name: "bool set to text becomes a string", value: true, rewrite: "maybe", want: "maybe"},
		{name: "timestamp rewritten in RFC 3339", value: time.Unix(0, 0), rewrite: "2024-05-01T10:00:00Z", want: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)},
		{name: "decimal with trailing text becomes a string", value: amqp091.Decimal{Scale: 1, Value: 1}, rewrite: "1/2/3", want: "1/2/3"},
		{name: "void given a value becomes a string", value: nil, rewrite: "now set", want: "now set"},
		{name: "table set to invalid JSON becomes a string", value: amqp091.Table{}, rewrite: "{", want: "{"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := amqp.Marshaler{}.Unmarshal(amqp091.Delivery{Headers: amqp091.Table{sluice.HeaderRetryCount: tt.value}})
			require.NoError(t, err)
			msg.Metadata.Set(sluice.HeaderRetryCount, tt.rewrite)
			pub, err := amqp.Marshaler{}.Marshal(msg)
			require.NoError(t, err)
			require.NoError(t, pub.Headers.Validate())
			got := pub.Headers[sluice.HeaderRetryCount]
			assert.IsType(t, tt.want, got)
			if wt, ok := tt.want.(time.Time); ok {
				assert.True(t, wt.Equal(got.(time.Time)))
				return
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestMarshalerHeadersWithoutRecordedTypeAreStrings(t *testing.T) {
	tests := []struct {
		name  string
		types string
	}{
		{name: "no types recorded"},
		{name: "types unreadable", types: "{not json"},
		{name: "type unknown", types: `{"n":"complex128"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := message.NewMessage("id-1", nil)
			msg.Metadata.Set("n", "42")
			if tt.types != "" {
				msg.Metadata.Set(headers.HeaderTypes, tt.types)
			}
			pub, err := amqp.Marshaler{}.Marshal(msg)
			require.NoError(t, err)
			assert.Equal(t, "42", pub.Headers["n"])
			assert.NotContains(t, pub.Headers, headers.HeaderTypes, "the type record is never published")
		})
	}
}

func TestMarshalerBrokerOwnedHeadersAreReadNotRepublished(t *testing.T) {
	death := []any{amqp091.Table{
		"count": int64(2), "reason": "expired", "queue": "sluice.delay.03",
		"time": time.Unix(1714557600, 0), "exchange": "sluice.delay.03", "routing-keys": []any{"0.1.q"},
	}}
	tests := []struct {
		key      string
		value    any
		wantText string
	}{
		{key: "x-death", value: death, wantText: `[{"count":2,"exchange":"sluice.delay.03","queue":"sluice.delay.03","reason":"expired","routing-keys":["0.1.q"],"time":"2024-05-01T10:00:00Z"}]`},
		{key: "x-first-death-queue", value: "q", wantText: "q"},
		{key: "x-first-death-reason", value: "rejected", wantText: "rejected"},
		{key: "x-first-death-exchange", value: "", wantText: ""},
		{key: "x-last-death-queue", value: "q2", wantText: "q2"},
		{key: "x-last-death-reason", value: "delivery_limit", wantText: "delivery_limit"},
		{key: "x-delivery-count", value: int64(3), wantText: "3"},
		{key: "x-received-from", value: []any{amqp091.Table{"uri": "amqp://upstream"}}, wantText: `[{"uri":"amqp://upstream"}]`},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			msg, pub := roundTrip(t, amqp091.Delivery{Headers: amqp091.Table{tt.key: tt.value, "kept": "yes"}})
			assert.Equal(t, tt.wantText, msg.Metadata.Get(tt.key), "readable as metadata")
			assert.NotContains(t, msg.Metadata.Get(headers.HeaderTypes), tt.key, "no type recorded for a header never republished")
			assert.NotContains(t, pub.Headers, tt.key, "never republished")
			assert.Equal(t, "yes", pub.Headers["kept"])
		})
	}
}

func TestMarshalerMessageID(t *testing.T) {
	long := strings.Repeat("i", 256)
	tests := []struct {
		name      string
		delivery  amqp091.Delivery
		want      string // "" means a generated id
		generated bool
	}{
		{name: "Watermill header wins", delivery: amqp091.Delivery{MessageId: "prop-id", Headers: amqp091.Table{headers.UUID: "wm-id"}}, want: "wm-id"},
		{name: "message-id property", delivery: amqp091.Delivery{MessageId: "prop-id"}, want: "prop-id"},
		{name: "empty Watermill header falls back", delivery: amqp091.Delivery{MessageId: "prop-id", Headers: amqp091.Table{headers.UUID: ""}}, want: "prop-id"},
		{name: "non-string Watermill header falls back", delivery: amqp091.Delivery{MessageId: "prop-id", Headers: amqp091.Table{headers.UUID: int64(7)}}, want: "prop-id"},
		{name: "Watermill header too long for message-id falls back", delivery: amqp091.Delivery{MessageId: "prop-id", Headers: amqp091.Table{headers.UUID: long}}, want: "prop-id"},
		{name: "Watermill header of 255 bytes is kept", delivery: amqp091.Delivery{Headers: amqp091.Table{headers.UUID: long[:255]}}, want: long[:255]},
		{name: "neither: generated", delivery: amqp091.Delivery{}, generated: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, pub := roundTrip(t, tt.delivery)
			if tt.generated {
				require.NotEmpty(t, msg.UUID)
				again, _ := amqp.Marshaler{}.Unmarshal(tt.delivery)
				assert.NotEqual(t, msg.UUID, again.UUID, "each consume of an id-less delivery gets its own id")
			} else {
				assert.Equal(t, tt.want, msg.UUID)
			}
			assert.Equal(t, msg.UUID, pub.MessageId, "the id is the published message-id")
			assert.Equal(t, msg.UUID, pub.Headers[headers.UUID], "and Watermill's header")
			assert.NotContains(t, msg.Metadata, headers.UUID, "the id header is not metadata")
		})
	}
}

// A message keeps its id between watermill-amqp's default marshaler and sluice's, both
// ways: sluice spells watermill-amqp's id header out (headers.UUID) instead of importing it.
func TestMarshalerMessageIDIsWatermillAMQPs(t *testing.T) {
	pub, err := wamqp.DefaultMarshaler{}.Marshal(message.NewMessage("wm-published", []byte("{}")))
	require.NoError(t, err)
	msg, err := amqp.Marshaler{}.Unmarshal(amqp091.Delivery{Headers: pub.Headers, Body: pub.Body})
	require.NoError(t, err)
	assert.Equal(t, "wm-published", msg.UUID, "sluice reads watermill-amqp's id")

	pub, err = amqp.Marshaler{}.Marshal(message.NewMessage("sluice-published", []byte("{}")))
	require.NoError(t, err)
	msg, err = wamqp.DefaultMarshaler{}.Unmarshal(amqp091.Delivery{Headers: pub.Headers, Body: pub.Body})
	require.NoError(t, err)
	assert.Equal(t, "sluice-published", msg.UUID, "watermill-amqp reads sluice's id")
}

func TestMarshalerProperties(t *testing.T) {
	ts := time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)
	full := amqp091.Delivery{
		ContentType:     "application/json",
		ContentEncoding: "gzip",
		DeliveryMode:    amqp091.Transient,
		Priority:        7,
		CorrelationId:   "corr-1",
		ReplyTo:         "replies",
		Expiration:      "60000",
		MessageId:       "m-1",
		Timestamp:       ts,
		Type:            "payment.requested",
		UserId:          "guest",
		AppId:           "shop",
		Exchange:        "ex",
		RoutingKey:      "rk",
		Redelivered:     true,
		Body:            []byte("body"),
	}
	tests := []struct {
		name  string
		d     amqp091.Delivery
		check func(t *testing.T, msg *message.Message, pub amqp091.Publishing)
	}{
		{name: "every carried property survives", d: full, check: func(t *testing.T, msg *message.Message, pub amqp091.Publishing) {
			assert.Equal(t, "application/json", pub.ContentType)
			assert.Equal(t, "gzip", pub.ContentEncoding)
			assert.Equal(t, amqp091.Transient, pub.DeliveryMode)
			assert.Equal(t, uint8(7), pub.Priority)
			assert.Equal(t, "corr-1", pub.CorrelationId)
			assert.Equal(t, "replies", pub.ReplyTo)
			assert.Equal(t, "m-1", pub.MessageId)
			assert.True(t, ts.Equal(pub.Timestamp), "timestamp %s", pub.Timestamp)
			assert.Equal(t, "payment.requested", pub.Type)
			assert.Equal(t, "shop", pub.AppId)
			assert.Equal(t, []byte("body"), pub.Body)
		}},
		{name: "expiration and user-id are not carried", d: full, check: func(t *testing.T, msg *message.Message, pub amqp091.Publishing) {
			assert.Empty(t, pub.Expiration, "a TTL would expire the copy inside the delay cascade")
			assert.Empty(t, pub.UserId, "RabbitMQ refuses a user-id other than the connection's")
		}},
		{name: "delivery facts are metadata, not headers", d: full, check: func(t *testing.T, msg *message.Message, pub amqp091.Publishing) {
			assert.Equal(t, "rk", msg.Metadata.Get(amqp.MetadataRoutingKey))
			assert.Equal(t, "ex", msg.Metadata.Get(amqp.MetadataExchange))
			assert.Equal(t, "true", msg.Metadata.Get(amqp.MetadataRedelivered))
			assert.Equal(t, "m-1", msg.Metadata.Get(amqp.MetadataMessageID))
			for k := range pub.Headers {
				assert.False(t, strings.HasPrefix(k, "amqp-"), "property metadata %q published as a header", k)
			}
		}},
		{name: "defaults: persistent, stamped now", d: amqp091.Delivery{Body: []byte("x")}, check: func(t *testing.T, msg *message.Message, pub amqp091.Publishing) {
			assert.Equal(t, amqp091.Persistent, pub.DeliveryMode)
			assert.WithinDuration(t, time.Now(), pub.Timestamp, 2*time.Second)
			assert.Zero(t, pub.Priority)
			assert.Empty(t, pub.ContentType)
		}},
		{name: "persistent stays persistent", d: amqp091.Delivery{DeliveryMode: amqp091.Persistent}, check: func(t *testing.T, msg *message.Message, pub amqp091.Publishing) {
			assert.Equal(t, amqp091.Persistent, pub.DeliveryMode)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, pub := roundTrip(t, tt.d)
			tt.check(t, msg, pub)
		})
	}
}

// A producer may send a header named like sluice's bookkeeping; it must not steer
// Marshal's typing, and it travels on as the producer's header.
func TestMarshalerIgnoresForeignHeaderTypesHeader(t *testing.T) {
	msg, pub := roundTrip(t, amqp091.Delivery{Headers: amqp091.Table{
		headers.HeaderTypes: `{"n":"int8"}`,
		"n":                 "300",
	}})
	assert.Empty(t, msg.Metadata.Get(headers.HeaderTypes))
	assert.Equal(t, "300", pub.Headers["n"])
	assert.Equal(t, `{"n":"int8"}`, pub.Headers[headers.HeaderTypes])
}

// A producer's header may carry the name of a property key (a bridge that copies HTTP
// headers sends "content-type" as one). It stays a header on every copy: it neither turns
// into the property nor is overwritten by it.
func TestMarshalerKeepsHeadersNamedLikePropertyKeys(t *testing.T) {
	tests := []struct {
		name       string
		d          amqp091.Delivery
		header     string
		want       any    // the republished header
		metadata   string // what the metadata key of the property or fact reads
		wantPubKey string // the metadata key the header is under
		check      func(t *testing.T, pub amqp091.Publishing)
	}{
		{
			name: "content-type header, no property", header: amqp.MetadataContentType, want: "text/csv",
			d:          amqp091.Delivery{Headers: amqp091.Table{amqp.MetadataContentType: "text/csv"}},
			wantPubKey: headers.MetadataPrefix + amqp.MetadataContentType,
			check: func(t *testing.T, pub amqp091.Publishing) {
				assert.Empty(t, pub.ContentType, "the header did not become the property")
			},
		},
		{
			name: "content-type header beside the property", header: amqp.MetadataContentType, want: "text/csv",
			d:          amqp091.Delivery{ContentType: "application/json", Headers: amqp091.Table{amqp.MetadataContentType: "text/csv"}},
			metadata:   "application/json",
			wantPubKey: headers.MetadataPrefix + amqp.MetadataContentType,
			check: func(t *testing.T, pub amqp091.Publishing) {
				assert.Equal(t, "application/json", pub.ContentType)
			},
		},
		{
			name: "typed header named like the priority", header: amqp.MetadataPriority, want: int32(7),
			d:          amqp091.Delivery{Priority: 3, Headers: amqp091.Table{amqp.MetadataPriority: int32(7)}},
			metadata:   "3",
			wantPubKey: headers.MetadataPrefix + amqp.MetadataPriority,
			check: func(t *testing.T, pub amqp091.Publishing) {
				assert.Equal(t, uint8(3), pub.Priority)
			},
		},
		{
			name: "header named like a delivery fact", header: amqp.MetadataRoutingKey, want: "forged",
			d:          amqp091.Delivery{RoutingKey: "rk", Headers: amqp091.Table{amqp.MetadataRoutingKey: "forged"}},
			metadata:   "rk",
			wantPubKey: headers.MetadataPrefix + amqp.MetadataRoutingKey,
		},
		{
			name: "header that starts with the prefix", header: headers.MetadataPrefix + "x", want: "y",
			d:          amqp091.Delivery{Headers: amqp091.Table{headers.MetadataPrefix + "x": "y"}},
			wantPubKey: headers.MetadataPrefix + headers.MetadataPrefix + "x",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, pub := roundTrip(t, tt.d)
			assert.Equal(t, tt.want, pub.Headers[tt.header], "republished as the producer's header")
			assert.Equal(t, tt.metadata, msg.Metadata.Get(tt.header), "the property key reads the property")
			assert.NotEmpty(t, msg.Metadata.Get(tt.wantPubKey), "the header is readable as metadata")
			if tt.check != nil {
				tt.check(t, pub)
			}
			// The next copy reads and sends the same.
			msg2, pub2 := roundTrip(t, deliveryOf(pub))
			assert.Equal(t, msg.Metadata.Get(tt.wantPubKey), msg2.Metadata.Get(tt.wantPubKey))
			assert.Equal(t, tt.want, pub2.Headers[tt.header])
		})
	}
}

func TestHeaderName(t *testing.T) {
	tests := []struct {
		key, name string
		ok        bool
	}{
		{key: "x-retry-count", name: "x-retry-count", ok: true},
		{key: "x-death", name: "x-death", ok: true},
		{key: amqp.MetadataContentType, ok: false},
		{key: amqp.MetadataRoutingKey, ok: false},
		{key: headers.HeaderTypes, ok: false},
		{key: headers.MetadataPrefix + amqp.MetadataContentType, name: amqp.MetadataContentType, ok: true},
		{key: headers.MetadataPrefix + headers.MetadataPrefix + "x", name: headers.MetadataPrefix + "x", ok: true},
		// Not a key Unmarshal makes (x needs no escape): a header of that very name.
		{key: headers.MetadataPrefix + "x", name: headers.MetadataPrefix + "x", ok: true},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			name, ok := headers.HeaderName(tt.key)
			assert.Equal(t, tt.ok, ok)
			assert.Equal(t, tt.name, name)
		})
	}
}

// What AMQP cannot carry is left out and named, instead of a publish RabbitMQ would answer
// by closing the connection.
func TestMarshalerLeavesOutWhatAMQPCannotCarry(t *testing.T) {
	longKey := strings.Repeat("k", 256)
	tests := []struct {
		name        string
		frameMax    int
		build       func(msg *message.Message)
		wantDropped []string
		wantKept    []string
	}{
		{
			name:        "metadata key over 255 bytes",
			build:       func(msg *message.Message) { msg.Metadata.Set(longKey, "v") },
			wantDropped: []string{longKey[:61] + "…"},
		},
		{
			name:        "property value over 255 bytes",
			build:       func(msg *message.Message) { msg.Metadata.Set(amqp.MetadataContentType, strings.Repeat("t", 256)) },
			wantDropped: []string{amqp.MetadataContentType},
		},
		{
			name: "headers beyond frame_max: the largest producer header goes first",
			build: func(msg *message.Message) {
				msg.Metadata.Set("producer-pad", strings.Repeat("p", 130_000))
				msg.Metadata.Set("producer-small", "s")
				msg.Metadata.Set(sluice.HeaderRetryHistory, strings.Repeat("h", 4000))
				msg.Metadata.Set(sluice.HeaderErrorStack, strings.Repeat("s", 16000))
			},
			wantDropped: []string{"producer-pad"},
			wantKept:    []string{"producer-small", sluice.HeaderRetryHistory, sluice.HeaderErrorStack},
		},
		{
			name:     "sluice's own headers go only when nothing else is left",
			frameMax: 4096,
			build: func(msg *message.Message) {
				msg.Metadata.Set("producer-a", strings.Repeat("a", 100))
				msg.Metadata.Set(sluice.HeaderErrorStack, strings.Repeat("s", 16000))
				msg.Metadata.Set(sluice.HeaderRetryCount, "3")
			},
			wantDropped: []string{"producer-a", sluice.HeaderErrorStack},
			wantKept:    []string{sluice.HeaderRetryCount},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := message.NewMessage("id-1", []byte("x"))
			tt.build(msg)
			m := amqp.Marshaler{FrameMax: tt.frameMax}
			pub, err := m.Marshal(msg)
			require.NoError(t, err)
			require.NoError(t, pub.Headers.Validate())
			frameMax := tt.frameMax
			if frameMax == 0 {
				frameMax = amqp.DefaultFrameMax
			}
			assert.LessOrEqual(t, encodedHeaderFrame(t, pub), frameMax-8, "content header must fit one frame")
			assertShortstrs(t, pub)
			dropped := strings.Split(pub.Headers[headers.Dropped].(string), ",")
			assert.ElementsMatch(t, tt.wantDropped, dropped)
			for _, k := range tt.wantKept {
				assert.Contains(t, pub.Headers, k)
			}
			assert.Equal(t, "id-1", pub.Headers[headers.UUID], "the id always travels")

			// A later copy keeps the record, and adds to it only what it drops itself.
			again, _ := amqp.Marshaler{}.Unmarshal(amqp091.Delivery{Headers: pub.Headers, MessageId: pub.MessageId})
			pub2, _ := m.Marshal(again)
			assert.Equal(t, pub.Headers[headers.Dropped], pub2.Headers[headers.Dropped])
		})
	}
}

func TestMarshalerLongMessageIDStaysInHeader(t *testing.T) {
	id := strings.Repeat("u", 300)
	pub, err := amqp.Marshaler{}.Marshal(message.NewMessage(id, nil))
	require.NoError(t, err)
	assert.Empty(t, pub.MessageId, "message-id is a short string: at most 255 bytes")
	assert.Equal(t, id, pub.Headers[headers.UUID])
}

// encodedHeaderFrame is the content header's payload size as AMQP 0-9-1 encodes pub,
// counted here independently of the marshaler.
func encodedHeaderFrame(t *testing.T, pub amqp091.Publishing) int {
	t.Helper()
	n := 14
	for _, s := range []string{pub.ContentType, pub.ContentEncoding, pub.CorrelationId, pub.ReplyTo, pub.Expiration, pub.MessageId, pub.Type, pub.UserId, pub.AppId} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	if len(pub.Headers) > 0 {
		n += encodedTable(pub.Headers)
	}
	if pub.DeliveryMode != 0 {
		n++
	}
	if pub.Priority != 0 {
		n++
	}
	if !pub.Timestamp.IsZero() {
		n += 8
	}
	return n
}

func encodedTable(tb amqp091.Table) int {
	n := 4
	for k, v := range tb {
		n += 1 + len(k) + encodedField(v)
	}
	return n
}

func encodedField(v any) int {
	switch x := v.(type) {
	case nil:
		return 1
	case bool, int8, uint8:
		return 2
	case int16, uint16:
		return 3
	case int32, uint32, int, float32:
		return 5
	case amqp091.Decimal:
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
			n += encodedField(e)
		}
		return n
	case amqp091.Table:
		return 1 + encodedTable(x)
	}
	panic("unexpected field type")
}

// assertShortstrs checks every AMQP short string of pub: properties and table keys.
func assertShortstrs(t *testing.T, pub amqp091.Publishing) {
	t.Helper()
	for _, s := range []string{pub.ContentType, pub.ContentEncoding, pub.CorrelationId, pub.ReplyTo, pub.Expiration, pub.MessageId, pub.Type, pub.UserId, pub.AppId} {
		assert.LessOrEqual(t, len(s), 255, "property %q", s)
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case amqp091.Table:
			for k, e := range x {
				assert.LessOrEqual(t, len(k), 255, "table key %q", k)
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

// Header names are byte strings; the type record is JSON, which would turn invalid UTF-8
// into U+FFFD and lose the name's type.
func TestMarshalerTypeOfHeaderNameNotUTF8(t *testing.T) {
	_, pub := roundTrip(t, amqp091.Delivery{Headers: amqp091.Table{"n\xff": int16(5), "n\ufffd": int8(6)}})
	assert.Equal(t, int16(5), pub.Headers["n\xff"])
	assert.Equal(t, int8(6), pub.Headers["n\ufffd"])
}
