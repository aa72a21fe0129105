package otelsetup

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/sluice-go/sluice/telemetry"
)

// Errors of Operate.
var (
	// ErrNoStack is returned by Operate without OperateConfig.Stack.
	ErrNoStack = errors.New("otelsetup: Operate needs the stack it watches")
	// ErrNotConsuming is the readiness reason while the stack does not consume.
	ErrNotConsuming = errors.New("not consuming")
	// ErrNotConnected is the readiness reason while the broker's connection is down.
	ErrNotConnected = errors.New("not connected to the broker")
)

// Stack is what Operate reads of a service's stack; *router.Stack is one.
type Stack interface {
	// Consuming reports whether the stack consumes now.
	Consuming() bool
	// PausedHandlers returns the handlers a breaker has paused.
	PausedHandlers() []string
	// ConsumedQueues returns the queues the handlers consume.
	ConsumedQueues() []string
}

// JournalStack is a stack whose idempotency step may keep a journal; *router.Stack is one.
type JournalStack interface {
	// JournalState returns the journal's figures, and false when the stack keeps none.
	JournalState() (telemetry.JournalState, bool)
}

// OperateConfig configures Operate. Only Stack is required.
type OperateConfig struct {
	// Stack is the stack whose consumption and pauses readiness follows and whose queues'
	// depths are watched. Required; register its handlers before calling Operate, since
	// the queues are read once.
	Stack Stack
	// Broker is the stack's broker (router.Stack.Broker()). When it reports its
	// connection (telemetry.ConnectionState: RabbitMQ's does), sluice_connection_up and
	// sluice_connection_reconnects_total are reported and readiness follows the
	// connection; when it reads queue depths (telemetry.DepthSource: both brokers do),
	// sluice_queue_depth and sluice_queue_consumers are. Nil means neither.
	Broker any
	// Instrumentation records the metrics; it must be built on these Providers (the one
	// given to router.Config.Telemetry). Nil means a new one from Providers.Instrumentation.
	Instrumentation *telemetry.Instrumentation
	// ManagementURL, when set, reads depths from RabbitMQ's management API instead of the
	// broker (which then also reports unacknowledged messages); see
	// telemetry.NewManagementSource.
	ManagementURL string
	// DepthInterval is how often depths are read. Zero means
	// telemetry.DefaultDepthInterval.
	DepthInterval time.Duration
	// Logger receives the depth watcher's lines. Nil means slog.Default().
	Logger *slog.Logger
}

// Operations is what Operate started; Close stops it.
type Operations struct {
	closers []func() error
}

// Operate gives a service, in one call, what the shipped Grafana dashboard and
// Prometheus alert rules (deploy/) read beside the per-message metrics, and a readiness
// that follows the service's state:
//
//   - readiness (/readyz, sluice_ready) fails while the stack does not consume, while a
//     breaker has paused one of its handlers, and while the broker's connection is down;
//   - sluice_connection_up and sluice_connection_reconnects_total from the broker;
//   - sluice_queue_depth and sluice_queue_consumers of every consumed queue, its
//     dead-letter queue and archive, and sluice.unrouted (the dashboard's DLQ panels);
//   - for a stack that is a DebugStack (*router.Stack is), its retry statistics and retry
//     decision matrix on RetriesPath and PolicyPath (ServeStack);
//   - for a stack that is a JournalStack with an idempotency step, the
//     sluice_idempotency_journal_* metrics (the dashboard's journal row).
//
// Call it after the stack's handlers are registered and before Stack.Run; from then on
// the service is not ready until Run consumes. Between Setup and Operate the Health has
// only the checks Config.Health brought: a service whose probe must not read ready in
// that window passes a Health whose check already fails, as Config.Health says. Close stops the depth reads and unregisters the
// connection metrics; the readiness checks stay, and fail once the stack stops.
func (p *Providers) Operate(cfg OperateConfig) (*Operations, error) {
	if cfg.Stack == nil {
		return nil, ErrNoStack
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	inst := cfg.Instrumentation
	if inst == nil {
		var err error
		if inst, err = p.Instrumentation(); err != nil {
			return nil, err
		}
	}
	health := p.Health()
	stack := cfg.Stack
	if ds, ok := stack.(DebugStack); ok {
		p.ServeStack(ds)
	}
	health.AddReadyCheck("consumer", func() error {
		if !stack.Consuming() {
			return ErrNotConsuming
		}
		return nil
	})
	health.AddReadyCheck("breaker", func() error {
		if paused := stack.PausedHandlers(); len(paused) > 0 {
			return fmt.Errorf("handler paused while its breaker is open: %s", strings.Join(paused, ", "))
		}
		return nil
	})

	ops := &Operations{}
	if state, ok := cfg.Broker.(telemetry.ConnectionState); ok {
		reg, err := inst.RegisterConnection(state)
		if err != nil {
			return nil, err
		}
		ops.closers = append(ops.closers, reg.Unregister)
		health.AddReadyCheck("broker", func() error {
			if !state.Connected() {
				return ErrNotConnected
			}
			return nil
		})
	}

	if js, ok := stack.(JournalStack); ok {
		if _, keeps := js.JournalState(); keeps {
			reg, err := inst.RegisterJournal(func() telemetry.JournalState {
				st, _ := js.JournalState()
				return st
			})
			if err != nil {
				_ = ops.Close()
				return nil, err
			}
			ops.closers = append(ops.closers, reg.Unregister)
		}
	}

	source, _ := cfg.Broker.(telemetry.DepthSource)
	if cfg.ManagementURL != "" {
		ms, err := telemetry.NewManagementSource(cfg.ManagementURL, "")
		if err != nil {
			_ = ops.Close()
			return nil, err
		}
		source = ms
	}
	if queues := stack.ConsumedQueues(); source != nil && len(queues) > 0 {
		dcfg := telemetry.DepthConfig{
			Source: source, Queues: telemetry.DepthQueuesFor(queues...),
			Interval: cfg.DepthInterval, Logger: cfg.Logger,
		}
		if err := dcfg.Validate(); err != nil {
			_ = ops.Close()
			return nil, err
		}
		ops.watchOnceConsuming(inst, stack, dcfg)
	}
	return ops, nil
}

// consumingPoll is how often Operate looks whether the stack consumes yet.
const consumingPoll = 50 * time.Millisecond

// watchOnceConsuming starts the depth watcher once the stack consumes: Run declares the
// queues, and a first read before would find none of them and wait a whole interval to
// read again.
func (o *Operations) watchOnceConsuming(inst *telemetry.Instrumentation, stack Stack, cfg telemetry.DepthConfig) {
	stop, done := make(chan struct{}), make(chan struct{})
	var watcher *telemetry.DepthWatcher
	go func() {
		defer close(done)
		t := time.NewTicker(consumingPoll)
		defer t.Stop()
		for !stack.Consuming() {
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
		w, err := inst.WatchDepth(cfg)
		if err != nil {
			cfg.Logger.Error("queue depths not reported", "error", err)
			return
		}
		watcher = w
	}()
	o.closers = append(o.closers, func() error {
		close(stop)
		<-done
		if watcher == nil {
			return nil
		}
		return watcher.Close()
	})
}

// Close stops what Operate started, last started first, and returns their errors.
func (o *Operations) Close() error {
	var errs []error
	for i := len(o.closers) - 1; i >= 0; i-- {
		errs = append(errs, o.closers[i]())
	}
	o.closers = nil
	return errors.Join(errs...)
}
