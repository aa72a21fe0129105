package dlq_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/dlqview"
)

func TestDisplayBounds(t *testing.T) {
	now := time.Now()
	many := amqp091.Table{}
	for i := range dlqview.MaxHeadersShown + 10 {
		many["h-"+strconv.Itoa(1000+i)] = "v"
	}
	cases := []struct {
		name          string
		body          []byte
		headers       amqp091.Table
		wantTruncated bool
		wantEncoding  string
		wantOmitted   int
	}{
		{name: "small text", body: []byte(`{"a":1}`), wantEncoding: "utf-8"},
		{name: "exactly the preview", body: bytes.Repeat([]byte("a"), dlqview.PreviewBytes), wantEncoding: "utf-8"},
		{name: "5 MB text", body: bytes.Repeat([]byte("é"), 5<<20/2), wantTruncated: true, wantEncoding: "utf-8"},
		{name: "20 MB binary", body: bytes.Repeat([]byte{0xff, 0x00}, 10<<20), wantTruncated: true, wantEncoding: "base64"},
		{name: "huge header values", body: []byte("x"), headers: amqp091.Table{"x-big": strings.Repeat("h", 100_000),
			sluice.HeaderErrorMessage: strings.Repeat("e", 100_000)}, wantEncoding: "utf-8"},
		{name: "too many headers", body: []byte("x"), headers: many, wantEncoding: "utf-8", wantOmitted: len(many) - dlqview.MaxHeadersShown},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := dlq.NewRecord(amqp091.Delivery{MessageId: "m", Body: tc.body, Headers: tc.headers}, "q", 1, now)
			d := dlqview.Of(dlqview.Record(r))
			assert.Equal(t, len(tc.body), d.PayloadBytes)
			assert.Equal(t, tc.wantTruncated, d.PayloadTruncated)
			assert.Equal(t, tc.wantEncoding, d.PreviewEncoding)
			assert.LessOrEqual(t, len(d.Preview), dlqview.PreviewBytes)
			assert.Equal(t, tc.wantOmitted, d.HeadersOmitted)
			assert.LessOrEqual(t, len(d.Record.Headers), dlqview.MaxHeadersShown)
			for k, v := range d.Record.Headers {
				assert.LessOrEqual(t, len(v), dlqview.HeaderValueBytes, k)
			}
			assert.LessOrEqual(t, len(d.Record.ErrorMessage), dlqview.ErrorTextBytes)
			assert.Nil(t, d.Record.Payload, "the display never carries the payload")
			assert.Len(t, r.Payload, len(tc.body), "the record keeps the exact payload")
			b, err := json.Marshal(r)
			require.NoError(t, err)
			assert.Less(t, len(b), 64<<10, "a record's JSON is bounded")
			var got map[string]any
			require.NoError(t, json.Unmarshal(b, &got))
			assert.EqualValues(t, len(tc.body), got["payload_bytes"])
			assert.Equal(t, tc.wantTruncated, got["payload_truncated"])
			assert.Contains(t, got["masking"], "display only")
		})
	}
}

func TestDisplayMasks(t *testing.T) {
	now := time.Now()
	body := []byte(`{"broker":"amqp://admin:broker-pw@rabbit:5672/","note":"` + strings.Repeat("n", dlqview.PreviewBytes-60) + `postgres://app:cut-pw@db/app"}`)
	r := dlq.NewRecord(amqp091.Delivery{MessageId: "m", Body: body, CorrelationId: "redis://:corr-pw@cache", Headers: amqp091.Table{
		"Authorization":           "Bearer auth-pw",
		"x-api-key":               "key-pw",
		"x-db":                    "postgres://app:header-pw@db/app",
		sluice.HeaderErrorMessage: "dial https://bot:error-pw@hooks.example.com failed",
	}}, "q", 1, now)
	d := dlqview.Of(dlqview.Record(r))
	b, err := json.Marshal(r)
	require.NoError(t, err)
	sum, err := json.Marshal(dlqview.SummaryOf(dlqview.Record(r)))
	require.NoError(t, err)
	for _, shown := range []string{d.Preview, string(b), string(sum), d.Record.ErrorMessage, d.Record.Properties.CorrelationID} {
		for _, secret := range []string{"broker-pw", "cut-pw", "cut-", "auth-pw", "key-pw", "header-pw", "error-pw", "corr-pw"} {
			assert.NotContains(t, shown, secret)
		}
	}
	assert.Contains(t, d.Preview, "amqp://admin:xxxxx@rabbit:5672/")
	assert.Equal(t, "xxxxx", d.Record.Headers["Authorization"])
	assert.Equal(t, "postgres://app:xxxxx@db/app", d.Record.Headers["x-db"])
	assert.Equal(t, "dial https://bot:xxxxx@hooks.example.com failed", d.Record.ErrorMessage)
	assert.Contains(t, string(r.Payload), "broker-pw", "masking is display-only: the record keeps the exact bytes")
	assert.Equal(t, "Bearer auth-pw", r.Headers["Authorization"])
}

// TestDisplayRecordMirrorsRecord: dlqview.Record is dlq.Record's field list (the compiler
// checks the names and types where dlq converts one into the other); its JSON names must be
// the same too, or the display form and a Record decoded from it would disagree.
func TestDisplayRecordMirrorsRecord(t *testing.T) {
	want, got := reflect.TypeFor[dlq.Record](), reflect.TypeFor[dlqview.Record]()
	require.Equal(t, want.NumField(), got.NumField())
	for i := range want.NumField() {
		assert.Equal(t, want.Field(i).Name, got.Field(i).Name)
		assert.Equal(t, want.Field(i).Tag.Get("json"), got.Field(i).Tag.Get("json"), want.Field(i).Name)
	}
}
