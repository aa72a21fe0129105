package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/otelnames"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-go/sluice/internal/topology"
)

// Queue kinds, the values of otelnames.MetricAttrKind.
const (
	QueueKindConsumed = "consumed"
	QueueKindDLQ      = "dlq"
	QueueKindArchive  = "archive"
	QueueKindUnrouted = "unrouted"
)

// Errors of WatchDepth.
var (
	// ErrNoDepthSource is returned by DepthConfig.Validate without a Source.
	ErrNoDepthSource = errors.New("telemetry: depth watcher needs a source")
	// ErrNoDepthQueues is returned by DepthConfig.Validate without queues to watch.
	ErrNoDepthQueues = errors.New("telemetry: depth watcher needs queues")
	// ErrDepthInterval is returned by DepthConfig.Validate for an interval below
	// minDepthInterval.
	ErrDepthInterval = errors.New("telemetry: depth interval too short")
)

// DefaultDepthInterval is how often a DepthWatcher reads the broker by default.
const DefaultDepthInterval = 15 * time.Second

// minDepthInterval is the shortest interval allowed: every read is a round trip to the
// broker (one channel per queue over AMQP, one HTTP request over the management API).
const minDepthInterval = 500 * time.Millisecond

// QueueDepth is what a DepthSource reads of one queue: sluice.QueueDepth, which both
// brokers' QueueDepth methods return, so that either broker is a DepthSource.
type QueueDepth = sluice.QueueDepth

// DepthSource reads a queue's depth from the broker.
type DepthSource interface {
	// QueueDepth returns queue's depth, or an error wrapping sluice.ErrQueueNotFound when
	// queue does not exist: the watcher then reports no depth for it (the series is
	// absent), and logs it once.
	QueueDepth(ctx context.Context, queue string) (QueueDepth, error)
}

// DepthQueue is a queue to watch and its role.
type DepthQueue struct {
	// Name is the queue's name.
	Name string
	// Kind is one of the QueueKind constants.
	Kind string
}

// DepthQueuesFor returns what an operator watches of consumed queues: each queue, its
// dead-letter queue and its archive, and topology.UnroutedQueue.
func DepthQueuesFor(queues ...string) []DepthQueue {
	out := make([]DepthQueue, 0, 3*len(queues)+1)
	for _, q := range queues {
		out = append(out,
			DepthQueue{Name: q, Kind: QueueKindConsumed},
			DepthQueue{Name: q + topology.DeadLetterSuffix, Kind: QueueKindDLQ},
			DepthQueue{Name: topology.Archive(q), Kind: QueueKindArchive})
	}
	return append(out, DepthQueue{Name: topology.UnroutedQueue, Kind: QueueKindUnrouted})
}

// DepthConfig configures WatchDepth.
type DepthConfig struct {
	// Source reads the broker. Required.
	Source DepthSource
	// Queues are the queues to watch. Required.
	Queues []DepthQueue
	// Interval is how often the broker is read, whatever the scrape rate: scrapes read
	// the last values. Zero means DefaultDepthInterval; below minDepthInterval is an
	// error.
	Interval time.Duration
	// Logger receives a line when a queue goes missing or cannot be read, and when it is
	// back: once per change, not once per read. Nil means slog.Default().
	Logger *slog.Logger
}

// Validate applies the defaults and checks c.
func (c *DepthConfig) Validate() error {
	if c.Source == nil {
		return ErrNoDepthSource
	}
	if len(c.Queues) == 0 {
		return ErrNoDepthQueues
	}
	if c.Interval == 0 {
		c.Interval = DefaultDepthInterval
	}
	if c.Interval < minDepthInterval {
		return fmt.Errorf("%w: %s (minimum %s)", ErrDepthInterval, c.Interval, minDepthInterval)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// DepthWatcher reads queue depths in the background and reports the last values as
// gauges. Close stops it.
type DepthWatcher struct {
	cfg  DepthConfig
	reg  metric.Registration
	stop chan struct{}
	done chan struct{}
	once sync.Once

	mu     sync.Mutex
	depths map[string]QueueDepth // by queue name; a queue not read is absent
	status map[string]string     // "ok", "absent" or "error", to log changes only
	rounds int64                 // rounds of reads completed
}

// WatchDepth starts reading cfg.Queues from cfg.Source every cfg.Interval (the first
// read at once) and reports sluice.queue.depth and sluice.queue.consumers.
func (in *Instrumentation) WatchDepth(cfg DepthConfig) (*DepthWatcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	depth, err := in.meter.Int64ObservableGauge(otelnames.MetricQueueDepth,
		metric.WithDescription("Messages in a queue, read from the broker: ready or unacked."), metric.WithUnit("{message}"))
	if err != nil {
		return nil, fmt.Errorf("create gauge %s: %w", otelnames.MetricQueueDepth, err)
	}
	consumers, err := in.meter.Int64ObservableGauge(otelnames.MetricQueueConsumers,
		metric.WithDescription("Consumers of a queue, read from the broker."), metric.WithUnit("{consumer}"))
	if err != nil {
		return nil, fmt.Errorf("create gauge %s: %w", otelnames.MetricQueueConsumers, err)
	}
	w := &DepthWatcher{
		cfg:    cfg,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		depths: map[string]QueueDepth{},
		status: map[string]string{},
	}
	w.reg, err = in.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
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

func (w *DepthWatcher) run() {
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
func (w *DepthWatcher) poll() {
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

// Rounds returns how many rounds of reads have completed: two more than a caller saw
// before a change means the values reflect it.
func (w *DepthWatcher) Rounds() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rounds
}

// Close stops the reads and the gauges. It waits for a read under way to end.
func (w *DepthWatcher) Close() error {
	var err error
	w.once.Do(func() {
		close(w.stop)
		<-w.done
		err = w.reg.Unregister()
	})
	return err
}
