package dlq_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/headers"
)

func TestNewRecord(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name      string
		d         amqp091.Delivery
		wantID    string
		wantType  string
		wantMsg   string
		wantAge   time.Duration
		wantNoAge bool
		wantQueue string
		// wantIgnored is the recorded origin the record does not follow.
		wantIgnored string
	}{
		{
			name: "sluice record",
			d: amqp091.Delivery{MessageId: "amqp-id", Headers: amqp091.Table{
				headers.UUID:                  "wm-id",
				sluice.HeaderErrorType:        "invalid_amount",
				sluice.HeaderErrorMessage:     "amount must be positive",
				headers.FailedAt:              now.Add(-90 * time.Second).Format(time.RFC3339Nano),
				sluice.HeaderOriginalQueue:    "q.p2",
				sluice.HeaderLastError:        "older",
				sluice.HeaderLastErrorMessage: "older message",
			}, Timestamp: now.Add(-time.Hour)},
			wantID: "wm-id", wantType: "invalid_amount", wantMsg: "amount must be positive", wantAge: 90 * time.Second, wantQueue: "q.p2",
		},
		{
			name: "an origin that is not the queue nor one of its partitions is not followed",
			d: amqp091.Delivery{MessageId: "m", Headers: amqp091.Table{
				sluice.HeaderOriginalQueue: "victim.q",
			}, Timestamp: now.Add(-time.Hour)},
			wantID: "m", wantAge: time.Hour, wantQueue: "q", wantIgnored: "victim.q",
		},
		{
			name: "RabbitMQ's x-first-death-queue naming another queue is not followed",
			d: amqp091.Delivery{MessageId: "m", Headers: amqp091.Table{
				"x-first-death-reason": "rejected", "x-first-death-queue": "q.px",
			}, Timestamp: now.Add(-time.Hour)},
			wantID: "m", wantType: "rabbitmq.rejected", wantMsg: "dead-lettered by RabbitMQ (rejected) from queue q.px",
			wantAge: time.Hour, wantQueue: "q", wantIgnored: "q.px",
		},
		{
			name: "message-id and the last error when the record is partial",
			d: amqp091.Delivery{MessageId: "amqp-id", Headers: amqp091.Table{
				sluice.HeaderLastError: "gateway_down", sluice.HeaderLastErrorMessage: "503",
			}, Timestamp: now.Add(-time.Hour)},
			wantID: "amqp-id", wantType: "gateway_down", wantMsg: "503", wantAge: time.Hour, wantQueue: "q",
		},
		{
			name: "dead-lettered by RabbitMQ from a foreign producer without ids",
			d: amqp091.Delivery{Body: []byte("foreign"), Headers: amqp091.Table{
				"x-first-death-reason": "delivery_limit", "x-first-death-queue": "q",
			}},
			wantID:   "sha256:" + sha16("foreign"),
			wantType: "rabbitmq.delivery_limit", wantMsg: "dead-lettered by RabbitMQ (delivery_limit) from queue q",
			wantNoAge: true, wantQueue: "q",
		},
		{
			name: "a failure time in the future is not trusted",
			d: amqp091.Delivery{MessageId: "m", Headers: amqp091.Table{
				headers.FailedAt: now.Add(time.Hour).Format(time.RFC3339Nano),
			}},
			wantID: "m", wantNoAge: true, wantQueue: "q",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := dlq.NewRecord(tc.d, "q", 7, now)
			assert.Equal(t, tc.wantID, r.ID)
			assert.Equal(t, 7, r.Position)
			assert.Equal(t, tc.wantType, r.ErrorType)
			assert.Equal(t, tc.wantMsg, r.ErrorMessage)
			assert.Equal(t, tc.wantQueue, r.OriginalQueue)
			assert.Equal(t, tc.wantIgnored, r.IgnoredOrigin)
			sel := dlq.SelectionRecord(tc.d, "q", 7, now)
			assert.Equal(t, tc.wantQueue, sel.OriginalQueue, "the selection record agrees")
			assert.Equal(t, tc.wantIgnored, sel.IgnoredOrigin, "the selection record agrees")
			assert.Equal(t, !tc.wantNoAge, r.HasAge)
			if !tc.wantNoAge {
				assert.Equal(t, tc.wantAge, r.Age)
			}
			assert.Equal(t, r.ID, dlq.NewRecord(tc.d, "q", 7, now).ID, "the id is the same on every read")
		})
	}
}

// sha16 is the first 16 hex digits of s's SHA-256.
func sha16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:16]
}

func TestRecordJSON(t *testing.T) {
	now := time.Now()
	cases := []struct {
		name         string
		body         []byte
		wantPayload  string
		wantEncoding string
	}{
		{name: "text payload", body: []byte(`{"a":1}`), wantPayload: `{"a":1}`, wantEncoding: "utf-8"},
		{name: "binary payload", body: []byte{0xff, 0x00, 0x01}, wantPayload: "/wAB", wantEncoding: "base64"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := dlq.NewRecord(amqp091.Delivery{MessageId: "m", Body: tc.body, Headers: amqp091.Table{
				headers.FailedAt: now.Add(-time.Minute).Format(time.RFC3339Nano), "n": int32(5),
			}}, "q", 1, now)
			b, err := json.Marshal(r)
			require.NoError(t, err)
			var got map[string]any
			require.NoError(t, json.Unmarshal(b, &got))
			assert.Equal(t, tc.wantPayload, got["payload"])
			assert.Equal(t, tc.wantEncoding, got["payload_encoding"])
			assert.InDelta(t, 60, got["age_seconds"], 0.001)
			assert.Equal(t, "m", got["id"])
			assert.Equal(t, "5", got["headers"].(map[string]any)["n"], "headers in the marshaler's text form")
			assert.NotContains(t, got["headers"], headers.HeaderTypes)
		})
	}
}

func TestSelector(t *testing.T) {
	old := dlq.Record{ID: "a", ErrorType: "x", Age: 2 * time.Hour, HasAge: true}
	young := dlq.Record{ID: "b", ErrorType: "y", Age: time.Minute, HasAge: true}
	ageless := dlq.Record{ID: "c", ErrorType: "x"}
	cases := []struct {
		name    string
		sel     dlq.Selector
		wantErr error
		want    []bool // old, young, ageless
	}{
		{name: "no selector", sel: dlq.Selector{}, wantErr: dlq.ErrNoSelector},
		{name: "all with a filter", sel: dlq.Selector{All: true, ErrorType: "x"}, wantErr: errors.New("any")},
		{name: "negative age", sel: dlq.Selector{OlderThan: -time.Second}, wantErr: errors.New("any")},
		{name: "all", sel: dlq.Selector{All: true}, want: []bool{true, true, true}},
		{name: "ids", sel: dlq.Selector{IDs: []string{"a", "c"}}, want: []bool{true, false, true}},
		{name: "error type", sel: dlq.Selector{ErrorType: "x"}, want: []bool{true, false, true}},
		{name: "older than skips unknown ages", sel: dlq.Selector{OlderThan: time.Hour}, want: []bool{true, false, false}},
		{name: "filters combine with AND", sel: dlq.Selector{ErrorType: "x", OlderThan: time.Hour}, want: []bool{true, false, false}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := dlq.ValidateSelector(tc.sel)
			if tc.wantErr != nil {
				require.Error(t, err)
				if errors.Is(tc.wantErr, dlq.ErrNoSelector) {
					assert.ErrorIs(t, err, dlq.ErrNoSelector)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, []bool{dlq.MatchSelector(tc.sel, old), dlq.MatchSelector(tc.sel, young), dlq.MatchSelector(tc.sel, ageless)})
		})
	}
}

func TestReplayPublishing(t *testing.T) {
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	d := amqp091.Delivery{
		Headers: amqp091.Table{
			headers.UUID:             "wm-1",
			sluice.HeaderRetryCount:  "3",
			headers.FirstFailureTime: "t", headers.LastFailureTime: "t",
			sluice.HeaderLastError: "e", sluice.HeaderLastErrorMessage: "m",
			sluice.HeaderRetryHistory: `[{"at":"2026-01-02T03:04:05Z","attempt":1,"type":"e","message":"m"}]`,
			headers.ArrivedRetryCount: "2", headers.TripAttempts: "2", headers.FailedStage: "idempotency key function",
			headers.DeferCount: "2", headers.FirstDeferTime: "t",
			sluice.HeaderErrorType: "e", sluice.HeaderErrorMessage: "m", sluice.HeaderErrorStack: "s",
			headers.ErrorClass: "permanent", headers.Handler: "h", headers.FailedAt: "t",
			headers.FailedHost: "host", headers.FailedPID: "1",
			headers.ReplayCount:        "1",
			sluice.HeaderOriginalQueue: "orders",
			headers.TraceParent:        "00-abc-def-01",
			headers.TraceState:         "v=1",
			"x-death":                  []any{amqp091.Table{"count": int64(1)}},
			"x-first-death-reason":     "rejected",
			"CC":                       []any{"victim.q"},
			"tenant":                   "acme",
			"priority-score":           int32(7),
		},
		ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: 2, Priority: 3,
		CorrelationId: "c", ReplyTo: "r", Expiration: "60000", MessageId: "wm-1", Timestamp: ts,
		Type: "payment.requested", UserId: "guest", AppId: "shop", Body: []byte("payload"),
	}
	now := time.Date(2026, 2, 3, 4, 5, 6, 0, time.UTC)
	pub := dlq.ReplayPublishing(d, 2, now, "orders.dlq", "orders")
	assert.Equal(t, amqp091.Table{
		headers.UUID:             "wm-1",
		headers.ReplayCount:      "2",
		headers.ReplayedAt:       "2026-02-03T04:05:06Z",
		headers.FirstFailureTime: "t",
		sluice.HeaderRetryHistory: `[{"at":"2026-01-02T03:04:05Z","attempt":1,"type":"e","message":"m"},` +
			`{"at":"2026-02-03T04:05:06Z","attempt":0,"type":"replay","message":"replayed from orders.dlq to orders"}]`,
		sluice.HeaderOriginalQueue: "orders",
		headers.TraceParent:        "00-abc-def-01",
		headers.TraceState:         "v=1",
		"tenant":                   "acme",
		"priority-score":           int32(7),
	}, pub.Headers)
	assert.Equal(t, amqp091.Publishing{
		Headers: pub.Headers, ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: 2, Priority: 3,
		CorrelationId: "c", ReplyTo: "r", MessageId: "wm-1", Timestamp: ts, Type: "payment.requested", AppId: "shop",
		Body: []byte("payload"),
	}, pub, "properties kept except expiration and user-id")
	assert.Equal(t, "3", d.Headers[sluice.HeaderRetryCount], "the delivery itself is not changed")
}

func TestMaskError(t *testing.T) {
	const u = "amqp://admin:s3cr%3Ft@rabbit:5672/"
	cases := []struct {
		name string
		err  error
		want string
	}{
		{name: "the URL", err: errors.New("dial " + u + " failed"), want: "dial amqp://admin:xxxxx@rabbit:5672/ failed"},
		{name: "the password alone", err: errors.New("bad password s3cr?t"), want: "bad password xxxxx"},
		{name: "the escaped password alone", err: errors.New("bad password s3cr%3Ft"), want: "bad password xxxxx"},
		{name: "nothing secret", err: sluice.ErrQueueNotFound, want: sluice.ErrQueueNotFound.Error()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := dlq.MaskError(tc.err, u)
			assert.Equal(t, tc.want, got.Error())
			assert.NotContains(t, got.Error(), "s3cr")
		})
	}
	masked := dlq.MaskError(errors.Join(errors.New("s3cr?t"), sluice.ErrQueueNotFound), u)
	assert.ErrorIs(t, masked, sluice.ErrQueueNotFound, "a masked error keeps the package's sentinels")
}

func TestNewRecord_OriginalQueueFromRabbitMQsOwnDeadLettering(t *testing.T) {
	d := amqp091.Delivery{MessageId: "m1", Headers: amqp091.Table{"x-first-death-queue": "orders.p3", "x-first-death-reason": "delivery_limit"}}
	assert.Equal(t, "orders.p3", dlq.NewRecord(d, "orders", 0, time.Now()).OriginalQueue)
	d.Headers["x-original-queue"] = "orders.p1"
	assert.Equal(t, "orders.p1", dlq.NewRecord(d, "orders", 0, time.Now()).OriginalQueue, "sluice's own record wins")
}

// A record lists the delivery's headers by their names, a producer's header called like a
// property key included, and leaves the properties and delivery facts to Properties.
func TestNewRecord_HeadersByTheirNames(t *testing.T) {
	d := amqp091.Delivery{
		MessageId: "m", ContentType: "application/json", RoutingKey: "rk", Exchange: "ex",
		Headers: amqp091.Table{amqp.MetadataContentType: "text/csv", "tenant": "acme", "n": int32(7)},
	}
	r := dlq.NewRecord(d, "q", 0, time.Now())
	assert.Equal(t, map[string]string{amqp.MetadataContentType: "text/csv", "tenant": "acme", "n": "7"}, r.Headers)
	assert.Equal(t, "application/json", r.Properties.ContentType)
}
