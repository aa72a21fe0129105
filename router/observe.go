package router

import (
	"context"
	"errors"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/telemetry"
)

// DepthSource returns what reads queue depths from b for telemetry's WatchDepth: on
// RabbitMQ a passive queue.declare (ready messages and consumers; a missing queue is
// absent), on the embedded broker its queue lengths. It returns nil for other brokers.
func DepthSource(b Broker) telemetry.DepthSource {
	switch b := b.(type) {
	case amqpBroker:
		return amqpDepth{b.Broker}
	case memoryBroker:
		return memoryDepth{b}
	}
	return nil
}

type amqpDepth struct{ b *amqp.Broker }

func (a amqpDepth) QueueDepth(ctx context.Context, queue string) (telemetry.QueueDepth, error) {
	ready, consumers, err := a.b.QueueDepth(ctx, queue)
	if errors.Is(err, amqp.ErrQueueNotFound) {
		return telemetry.QueueDepth{}, errors.Join(telemetry.ErrQueueAbsent, err)
	}
	if err != nil {
		return telemetry.QueueDepth{}, err
	}
	return telemetry.QueueDepth{Ready: int64(ready), Consumers: int64(consumers)}, nil
}

type memoryDepth struct{ b memoryBroker }

func (m memoryDepth) QueueDepth(_ context.Context, queue string) (telemetry.QueueDepth, error) {
	return telemetry.QueueDepth{Ready: int64(m.b.Len(queue))}, nil
}

// ConnectionState returns b's connection state for telemetry's RegisterConnection, or nil
// when b has no connection to lose (the embedded broker).
func ConnectionState(b Broker) telemetry.ConnectionState {
	if a, ok := b.(amqpBroker); ok {
		return a.Broker
	}
	return nil
}
