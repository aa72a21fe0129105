package amqp

import (
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
)

// TestCloseReasonTellsBrokerRefusalsFromLostConnections pins the fault suite's blackhole
// finding: amqp091 reports its own I/O failures (a missed heartbeat) as a 501 frame error,
// which must not pass for the broker refusing the message.
func TestCloseReasonTellsBrokerRefusalsFromLostConnections(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   *amqp.Error
		final bool
	}{
		{"heartbeat timeout (client side 501)", &amqp.Error{Code: amqp.FrameError, Reason: "read tcp: i/o timeout"}, false},
		{"frame error sent by the broker", &amqp.Error{Code: amqp.FrameError, Reason: "FRAME_ERROR", Server: true}, true},
		{"not found", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND", Server: true}, true},
		{"connection forced", &amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED", Server: true}, false},
		{"no error", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			closed := make(chan *amqp.Error, 1)
			closed <- tc.err
			err := closeReason(closed)
			assert.Equal(t, !tc.final, errors.Is(err, errChannelLost), "closeReason(%v) = %v", tc.err, err)
		})
	}
}
