package router

import "github.com/ThreeDotsLabs/watermill/message"

// ComposeForBenchmark returns h inside the stack's steps exactly as Handle wires the handler
// name, with no subscriber around it, so a benchmark can call the whole stack directly.
func (s *Stack) ComposeForBenchmark(name string, h message.HandlerFunc, opts ...HandlerOption) message.HandlerFunc {
	hc := handlerConfig{concurrency: s.cfg.Concurrency, prefetch: s.cfg.Prefetch, breaker: name}
	for _, o := range opts {
		o(&hc)
	}
	return s.compose(h, "", hc)
}
