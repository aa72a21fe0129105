package amqp_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
)

// A handler output the broker refused is dead-lettered, once its retries run out, with a
// type that says so rather than "error".
func TestErrorTypes(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{amqp.ErrUnroutable, "unroutable"},
		{amqp.ErrNacked, "broker_nack"},
		{broker.ErrClosed, "broker_closed"},
		{amqp.ErrDelayTooLong, "delay_too_long"},
		{broker.ErrPartitionKey, "partition_key"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			assert.Equal(t, tt.want, sluice.ErrorType(fmt.Errorf("publish output of m-1 to %q: %w", "payments.succeeded", tt.err)))
		})
	}
}
