// Package brokerwatch adapts a router.Broker to what telemetry watches beside the
// per-message metrics: queue depths (telemetry.WatchDepth) and the connection state
// (telemetry.RegisterConnection), for cmd/payments. Moved from package router, where they
// were DepthSource and ConnectionState.
package brokerwatch

import (
	"context"

	"github.com/sluice-go/sluice/router"
	"github.com/sluice-go/sluice/telemetry"
)

// rabbitDepth is RabbitMQ's passive queue.declare (amqp.Broker.QueueDepth).
type rabbitDepth interface {
	QueueDepth(ctx context.Context, queue string) (ready, consumers int, err error)
}

// queueLen is the embedded broker's queue length.
type queueLen interface {
	Len(queue string) int
}

// DepthSource returns what reads queue depths from b for telemetry's WatchDepth: on
// RabbitMQ a passive queue.declare (ready messages and consumers; a missing queue is
// absent), on the embedded broker its queue lengths. It returns nil for other brokers.
func DepthSource(b router.Broker) telemetry.DepthSource {
	switch b := b.(type) {
	case rabbitDepth:
		return amqpDepth{b}
	case queueLen:
		return memoryDepth{b}
	}
	return nil
}

type amqpDepth struct{ b rabbitDepth }

func (a amqpDepth) QueueDepth(ctx context.Context, queue string) (telemetry.QueueDepth, error) {
	ready, consumers, err := a.b.QueueDepth(ctx, queue)
	if err != nil { // a missing queue's error wraps sluice.ErrQueueNotFound
		return telemetry.QueueDepth{}, err
	}
	return telemetry.QueueDepth{Ready: int64(ready), Consumers: int64(consumers)}, nil
}

type memoryDepth struct{ b queueLen }

func (m memoryDepth) QueueDepth(_ context.Context, queue string) (telemetry.QueueDepth, error) {
	return telemetry.QueueDepth{Ready: int64(m.b.Len(queue))}, nil
}

// ConnectionState returns b's connection state for telemetry's RegisterConnection (the
// RabbitMQ broker's), or nil when b has no connection to lose (the embedded broker).
func ConnectionState(b router.Broker) telemetry.ConnectionState {
	if s, ok := b.(telemetry.ConnectionState); ok {
		return s
	}
	return nil
}
