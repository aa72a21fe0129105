package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/internal/topology"
)

// Queue kinds, the values of DepthQueue.Kind and of the kind attribute.
const (
	queueKindConsumed = "consumed"
	queueKindDLQ      = "dlq"
	queueKindArchive  = "archive"
	queueKindUnrouted = "unrouted"
)

// Errors of WatchDepth's configuration.
var (
	errNoDepthSource = errors.New("telemetry: depth watcher needs a source")
	errNoDepthQueues = errors.New("telemetry: depth watcher needs queues")
	errDepthInterval = errors.New("telemetry: depth interval too short")
)

// defaultDepthInterval is how often a depth watcher reads the broker by default.
const defaultDepthInterval = 15 * time.Second

// minDepthInterval is the shortest interval allowed: every read is a round trip to the
// broker (one channel per queue over AMQP, one HTTP request over the management API).
const minDepthInterval = 500 * time.Millisecond

// DepthSource reads a queue's depth from the broker: both brokers are one (their
// QueueDepth methods), and so is NewManagementSource's.
type DepthSource interface {
	// QueueDepth returns queue's depth, or an error wrapping sluice.ErrQueueNotFound when
	// queue does not exist: the watcher then reports no depth for it (the series is
	// absent), and logs it once.
	QueueDepth(ctx context.Context, queue string) (sluice.QueueDepth, error)
}

// DepthQueue is a queue to watch and its role.
type DepthQueue struct {
	// Name is the queue's name.
	Name string
	// Kind is the queue's role, the kind attribute of its series: "consumed", "dlq",
	// "archive" or "unrouted".
	Kind string
}

// DepthQueuesFor returns what an operator watches of consumed queues: each queue, its
// dead-letter queue and its archive, and sluice.unrouted.
func DepthQueuesFor(queues ...string) []DepthQueue {
	out := make([]DepthQueue, 0, 3*len(queues)+1)
	for _, q := range queues {
		out = append(out,
			DepthQueue{Name: q, Kind: queueKindConsumed},
			DepthQueue{Name: q + topology.DeadLetterSuffix, Kind: queueKindDLQ},
			DepthQueue{Name: topology.Archive(q), Kind: queueKindArchive})
	}
	return append(out, DepthQueue{Name: topology.UnroutedQueue, Kind: queueKindUnrouted})
}

// DepthConfig configures WatchDepth.
type DepthConfig struct {
	// Source reads the broker. Required.
	Source DepthSource
	// Queues are the queues to watch. Required.
	Queues []DepthQueue
	// Interval is how often the broker is read, whatever the scrape rate: scrapes read
	// the last values. Zero means 15s; below 500ms is an error.
	Interval time.Duration
	// Logger receives a line when a queue goes missing or cannot be read, and when it is
	// back: once per change, not once per read. Nil means slog.Default().
	Logger *slog.Logger
	// MeterProvider makes the gauges. Nil means the global one (otel.GetMeterProvider).
	MeterProvider metric.MeterProvider
}

// validate applies the defaults and checks c.
func (c *DepthConfig) validate() error {
	if c.Source == nil {
		return errNoDepthSource
	}
	if len(c.Queues) == 0 {
		return errNoDepthQueues
	}
	if c.Interval == 0 {
		c.Interval = defaultDepthInterval
	}
	if c.Interval < minDepthInterval {
		return fmt.Errorf("%w: %s (minimum %s)", errDepthInterval, c.Interval, minDepthInterval)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	return nil
}

// depthWatcher reads queue depths in the background and reports the last values as
// gauges. close stops it.
type depthWatcher struct {
	cfg  DepthConfig
	reg  metric.Registration
	stop chan struct{}
	done chan struct{}
	once sync.Once

	mu     sync.Mutex
	depths map[string]sluice.QueueDepth // by queue name; a queue not read is absent
	status map[string]string            // "ok", "absent" or "error", to log changes only
	rounds int64                        // rounds of reads completed
}

// WatchDepth starts reading cfg.Queues from cfg.Source every cfg.Interval (the first read
// at once) and reports sluice.queue.depth (state ready, and unacked where the source knows
// it) and sluice.queue.consumers, by queue and kind: what the shipped dashboard's queue
// and DLQ panels read. otelsetup.Providers.Operate starts one for a stack; a service that
// installs its own OpenTelemetry SDK starts it here. Call stop, which waits for a read
// under way, when the service stops.
func WatchDepth(cfg DepthConfig) (stop func() error, err error) {
	w, err := watchDepth(cfg)
	if err != nil {
		return nil, err
	}
	return w.close, nil
}

func watchDepth(cfg DepthConfig) (*depthWatcher, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	meter := cfg.MeterProvider.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	depth, err := meter.Int64ObservableGauge(otelnames.MetricQueueDepth,
		metric.WithDescription("Messages in a queue, read from the broker: ready or unacked."), metric.WithUnit("{message}"))
	if err != nil {
		return nil, fmt.Errorf("create gauge %s: %w", otelnames.MetricQueueDepth, err)
	}
	consumers, err := meter.Int64ObservableGauge(otelnames.MetricQueueConsumers,
		metric.WithDescription("Consumers of a queue, read from the broker."), metric.WithUnit("{consumer}"))
	if err != nil {
		return nil, fmt.Errorf("create gauge %s: %w", otelnames.MetricQueueConsumers, err)
	}
	w := &depthWatcher{
		cfg:    cfg,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		depths: map[string]sluice.QueueDepth{},
		status: map[string]string{},
	}
	w.reg, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, q := range w.cfg.Queues {
			d, ok := w.depths[q.Name]
			if !ok {
				continue
			}
			base := []attribute.KeyValue{otelnames.MetricAttrQueue.String(q.Name), otelnames.MetricAttrKind.String(q.Kind)}
			o.ObserveInt64(depth, d.Ready, metric.WithAttributes(append(base, otelnames.MetricAttrState.String("ready"))...))
			if d.UnackedKnown {
				o.ObserveInt64(depth, d.Unacked, metric.WithAttributes(append(base, otelnames.MetricAttrState.String("unacked"))...))
			}
			o.ObserveInt64(consumers, d.Consumers, metric.WithAttributes(base...))
		}
		return nil
	}, depth, consumers)
	if err != nil {
		return nil, fmt.Errorf("register depth callback: %w", err)
	}
	go w.run()
	return w, nil
}

func (w *depthWatcher) run() {
	defer close(w.done)
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		w.poll()
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
	}
}

// poll reads every queue once, each within the interval, so a hung broker cannot make
// rounds pile up.
func (w *depthWatcher) poll() {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.Interval)
	defer cancel()
	go func() {
		select {
		case <-w.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for _, q := range w.cfg.Queues {
		d, err := w.cfg.Source.QueueDepth(ctx, q.Name)
		w.mu.Lock()
		status := "ok"
		switch {
		case err == nil:
			w.depths[q.Name] = d
		case errors.Is(err, sluice.ErrQueueNotFound):
			delete(w.depths, q.Name)
			status = "absent"
		default:
			// A stale depth would read as current: report none until a read succeeds.
			delete(w.depths, q.Name)
			status = "error"
		}
		prev, seen := w.status[q.Name]
		w.status[q.Name] = status
		w.mu.Unlock()
		if prev == status || (!seen && status == "ok") {
			continue
		}
		switch status {
		case "ok":
			w.cfg.Logger.Info("queue depth readable again", "queue", q.Name, "kind", q.Kind)
		case "absent":
			w.cfg.Logger.Info("queue depth not reported: the queue does not exist", "queue", q.Name, "kind", q.Kind)
		default:
			w.cfg.Logger.Warn("queue depth not reported: reading it failed", "queue", q.Name, "kind", q.Kind, "error", err)
		}
	}
	w.mu.Lock()
	w.rounds++
	w.mu.Unlock()
}

// roundsDone returns how many rounds of reads have completed: two more than a caller saw
// before a change means the values reflect it.
func (w *depthWatcher) roundsDone() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rounds
}

// close stops the reads and the gauges. It waits for a read under way to end.
func (w *depthWatcher) close() error {
	var err error
	w.once.Do(func() {
		close(w.stop)
		<-w.done
		err = w.reg.Unregister()
	})
	return err
}
