package headers_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/headers"
)

func TestNativeRetries(t *testing.T) {
	cases := []struct {
		name                          string
		md                            message.Metadata
		wantRetries, wantRedeliveries int
	}{
		{name: "a first delivery", md: message.Metadata{}},
		{name: "a producer's x-delivery-count on a first delivery counts nothing",
			md: message.Metadata{"x-delivery-count": "99"}},
		{name: "the queue's redeliveries",
			md: message.Metadata{headers.Redelivered: "true", "x-delivery-count": "2"}, wantRetries: 2, wantRedeliveries: 2},
		{name: "added to the cascade's retries",
			md:          message.Metadata{headers.Redelivered: "true", "x-delivery-count": "2", sluice.HeaderRetryCount: "3"},
			wantRetries: 5, wantRedeliveries: 2},
		{name: "at most MaxRetryCountHeader",
			md:          message.Metadata{headers.Redelivered: "true", "x-delivery-count": "5", sluice.HeaderRetryCount: "99999999999999999999"},
			wantRetries: sluice.MaxRetryCountHeader, wantRedeliveries: 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			retries, redeliveries := headers.NativeRetries(tc.md)
			assert.Equal(t, tc.wantRetries, retries)
			assert.Equal(t, tc.wantRedeliveries, redeliveries)
		})
	}
}
