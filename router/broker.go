package router

import (
	"github.com/sluice-go/sluice/broker"
)

// Broker is what the stack requires of a broker: package broker's contract, one capability
// per interface. sluice's RabbitMQ broker (amqp.Connect, amqp.New) and its embedded one
// (memory.New) are Brokers as they are; the stack never asks which one it has.
type Broker = broker.Broker

// subscriber returns a subscriber with the handler's concurrency and prefetch.
func (s *Stack) subscriber(hc handlerConfig) broker.Subscriber {
	return s.broker.Subscriber(broker.SubscribeOptions{Concurrency: hc.concurrency, Prefetch: hc.prefetch})
}
