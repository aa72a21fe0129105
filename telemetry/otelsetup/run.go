package otelsetup

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-go/sluice/router"
)

// shutdownTimeout bounds Run's Shutdown: the spans still buffered are flushed within it.
const shutdownTimeout = 10 * time.Second

// Run runs stack with the OpenTelemetry SDK, in one call: Setup(ctx, cfg) (the providers
// installed globally, the metrics server on cfg.MetricsAddr), Operate(stack) (readiness,
// queue depths, the debug endpoints), stack.Run(ctx) until ctx ends or the stack is
// closed, then Shutdown, which flushes the spans, within 10 seconds. It returns the first
// error of Setup or Operate, or stack.Run's joined with Shutdown's. The stack stays open:
// its owner closes it. Call Setup, Operate and Shutdown yourself to serve the metrics
// before the stack is built, or to run several stacks.
func Run(ctx context.Context, stack *router.Stack, cfg Config) error {
	p, err := Setup(ctx, cfg)
	if err != nil {
		return err
	}
	err = p.Operate(stack)
	if err == nil {
		err = stack.Run(ctx)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	return errors.Join(err, p.Shutdown(sctx))
}
