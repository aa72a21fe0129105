package headers_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
)

func TestReadTrip(t *testing.T) {
	tests := []struct {
		name string
		md   message.Metadata
		want headers.Trip
	}{
		{name: "fresh", md: message.Metadata{}, want: headers.Trip{}},
		{name: "a producer's count", md: message.Metadata{sluice.HeaderRetryCount: "99"}, want: headers.Trip{Arrived: 99}},
		{name: "a producer's huge count, clamped", md: message.Metadata{sluice.HeaderRetryCount: "99999999999999999999"}, want: headers.Trip{Arrived: sluice.MaxRetryCountHeader}},
		{name: "sluice's retry copy", md: message.Metadata{sluice.HeaderRetryCount: "2", headers.TripAttempts: "2"}, want: headers.Trip{Made: 2, Carried: true}},
		{name: "sluice's retry copy of an arrived count", md: message.Metadata{sluice.HeaderRetryCount: "5", headers.ArrivedRetryCount: "3", headers.TripAttempts: "2"}, want: headers.Trip{Arrived: 3, Made: 2, Carried: true}},
		{name: "trip headers that disagree", md: message.Metadata{sluice.HeaderRetryCount: "1", headers.TripAttempts: "50"}, want: headers.Trip{Arrived: 1}},
		{name: "a replay copy", md: message.Metadata{headers.ReplayedAt: "2026-01-01T00:00:00Z"}, want: headers.Trip{Carried: true}},
		{name: "a replay time beside a count", md: message.Metadata{headers.ReplayedAt: "2026-01-01T00:00:00Z", sluice.HeaderRetryCount: "4"}, want: headers.Trip{Arrived: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.want, headers.ReadTrip(tt.md)) })
	}
}

func TestOwnOrigin(t *testing.T) {
	tests := []struct {
		origin string
		want   bool
	}{
		{"orders", true},
		{"orders.p0", true},
		{"orders.p12", true},
		{"orders.p", false},
		{"orders.px", false},
		{"orders.p1.dlq", false},
		{"orders.dlq", false},
		{"victim.q", false},
		{"orders2", false},
		{"", false},
	}
	for _, tt := range tests {
		t.Run(tt.origin, func(t *testing.T) { assert.Equal(t, tt.want, headers.OwnOrigin("orders", tt.origin)) })
	}
}

func TestRetryNote(t *testing.T) {
	assert.Empty(t, headers.RetryNote(message.Metadata{sluice.HeaderRetryCount: "3"}), "a record without trip headers")
	assert.Equal(t, "1 attempt made here", headers.RetryNote(message.Metadata{headers.TripAttempts: "1"}))
	assert.Equal(t, "3 attempts made here", headers.RetryNote(message.Metadata{headers.TripAttempts: "3"}))
	assert.Equal(t, "arrived with x-retry-count 99; 1 attempt made here",
		headers.RetryNote(message.Metadata{headers.TripAttempts: "1", headers.ArrivedRetryCount: "99"}))
}

func TestAgeStart(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	first, replayed := now.Add(-48*time.Hour), now.Add(-time.Minute)
	_, ok := headers.AgeStart(message.Metadata{headers.FirstFailureTime: failure.FormatTime(first)}, now)
	assert.False(t, ok, "a producer's first failure time does not count")
	got, ok := headers.AgeStart(message.Metadata{sluice.HeaderRetryCount: "1", headers.TripAttempts: "1", headers.FirstFailureTime: failure.FormatTime(first)}, now)
	assert.True(t, ok)
	assert.Equal(t, first, got)
	got, ok = headers.AgeStart(message.Metadata{headers.ReplayedAt: failure.FormatTime(replayed), headers.FirstFailureTime: failure.FormatTime(first)}, now)
	assert.True(t, ok)
	assert.Equal(t, replayed, got, "a replay starts the age over")
}

type stageErr struct{}

func (stageErr) Error() string       { return "no key" }
func (stageErr) FailedStage() string { return "idempotency key function" }

func TestStampWhere(t *testing.T) {
	md := message.Metadata{headers.Handler: "forged", headers.FailedStage: "forged"}
	headers.StampWhere(md, sluice.Permanent(fmt.Errorf("wrapped: %w", stageErr{})), "payments")
	assert.Equal(t, message.Metadata{headers.FailedStage: "idempotency key function"}, md)
	headers.StampWhere(md, errors.New("boom"), "payments")
	assert.Equal(t, message.Metadata{headers.Handler: "payments"}, md)
}

func TestBrokerOwnedSenderSelected(t *testing.T) {
	for _, k := range []string{"CC", "BCC", "x-death"} {
		assert.True(t, headers.BrokerOwned(k), k)
	}
	assert.False(t, headers.BrokerOwned("cc"), "RabbitMQ routes by CC and BCC only, case-sensitive")
}
