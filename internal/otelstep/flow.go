package otelstep

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/internal/otelnames"
)

// outcomes are the outcomes a flow counts in an array; any other is counted in a map.
var outcomes = [...]string{
	outcomeAck, outcomeRetry, outcomeDeadLetter, outcomeDiscard,
	outcomeDuplicate, outcomeDeferred, outcomeNack,
}

// outcomeIndex is o's place in outcomes, or -1.
func outcomeIndex(o string) int {
	for i, known := range outcomes {
		if o == known {
			return i
		}
	}
	return -1
}

// flow is what the consumer step keeps for one (queue, handler), built on its first
// attempt: the span's name and start options, the attempt counters and the histograms'
// attribute options.
//
// The three counters of every attempt (messaging.client.consumed.messages,
// sluice.messages.in_flight, sluice.messages) are atomic integers here, reported by
// observable instruments when a reader collects: a synchronous Add in the SDK resolves its
// attribute set and finds its aggregate under a lock, four times an attempt; an atomic add
// does not, and collecting costs the same once per export. The names, units, attributes and
// values are those of the synchronous instruments they replace.
type flow struct {
	queue, handler string

	spanName  string
	startOpts []trace.SpanStartOption // consumer kind and the attributes a sampler sees

	consumed *queueCount // shared by the flows of one queue
	inFlight atomic.Int64
	counts   [len(outcomes)]atomic.Int64
	other    sync.Map // outcome label -> *atomic.Int64, outcomes not in outcomes

	flightObs  []metric.ObserveOption // queue, handler
	outcomeObs [len(outcomes)][]metric.ObserveOption
	outcomeRec [len(outcomes)][]metric.RecordOption // sluice.handler.duration
	processed  []metric.RecordOption                // messaging.process.duration, no error.type
}

// queueCount is messaging.client.consumed.messages of one queue.
type queueCount struct {
	n   atomic.Int64
	obs []metric.ObserveOption
}

// flowKey names a flow.
type flowKey struct{ queue, handler string }

// flowFor returns the flow of (queue, handler), creating it on first use.
func (in *Instrumentation) flowFor(queue, handler string) *flow {
	k := flowKey{queue, handler}
	if f, ok := in.flows.Load(k); ok {
		return f.(*flow)
	}
	startAttrs := in.appendOperationAttrs(nil, semconv.MessagingOperationTypeProcess, "process", queue)
	f := &flow{
		queue:     queue,
		handler:   handler,
		spanName:  spanName("process", queue),
		startOpts: []trace.SpanStartOption{consumerKind, trace.WithAttributes(startAttrs...)},
		flightObs: observeOpts(in.metricAttrs(metricKey{queue: queue, handler: handler})),
		processed: in.messagingAttrs(messagingKey{op: opProcess, destination: queue}).rec,
	}
	for i, o := range outcomes {
		opts := in.metricAttrs(metricKey{queue: queue, handler: handler, outcome: string(o)})
		f.outcomeObs[i] = observeOpts(opts)
		f.outcomeRec[i] = opts.rec
	}
	qc := &queueCount{obs: observeOpts(in.messagingAttrs(messagingKey{op: opProcess, destination: queue}))}
	if got, loaded := in.consumedByQueue.LoadOrStore(queue, qc); loaded {
		qc = got.(*queueCount)
	}
	f.consumed = qc
	got, _ := in.flows.LoadOrStore(k, f)
	return got.(*flow)
}

// observeOpts is the attribute set of o as an observation option.
func observeOpts(o messagingOpts) []metric.ObserveOption {
	return []metric.ObserveOption{o.set}
}

// count adds one attempt with outcome o.
func (f *flow) count(o string) {
	if i := outcomeIndex(o); i >= 0 {
		f.counts[i].Add(1)
		return
	}
	n, _ := f.other.LoadOrStore(o, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
}

// durationOpts are sluice.handler.duration's options for outcome o.
func (in *Instrumentation) durationOpts(f *flow, o string) []metric.RecordOption {
	if i := outcomeIndex(o); i >= 0 {
		return f.outcomeRec[i]
	}
	return in.metricAttrs(metricKey{queue: f.queue, handler: f.handler, outcome: string(o)}).rec
}

// createFlowInstruments creates the observable counters of the flows and their callback.
func (in *Instrumentation) createFlowInstruments(m *instruments) error {
	var err error
	c := messagingconv.ClientConsumedMessages{}
	if m.consumedObs, err = m.meter.Int64ObservableCounter(c.Name(),
		metric.WithDescription(c.Description()), metric.WithUnit(c.Unit())); err != nil {
		return fmt.Errorf("create counter %s: %w", otelnames.MetricConsumedMessages, err)
	}
	if m.messagesObs, err = m.meter.Int64ObservableCounter(otelnames.MetricMessages,
		metric.WithDescription("Delivery attempts by outcome."), metric.WithUnit("{message}")); err != nil {
		return fmt.Errorf("create counter %s: %w", otelnames.MetricMessages, err)
	}
	if m.inFlightObs, err = m.meter.Int64ObservableUpDownCounter(otelnames.MetricInFlight,
		metric.WithDescription("Attempts being processed."), metric.WithUnit("{message}")); err != nil {
		return fmt.Errorf("create up-down counter %s: %w", otelnames.MetricInFlight, err)
	}
	// The registration lives as long as the instruments: Rebind unregisters it.
	observe := func(ctx context.Context, o metric.Observer) error { return in.observeFlows(ctx, m, o) }
	if m.flowsReg, err = m.meter.RegisterCallback(observe, m.consumedObs, m.messagesObs, m.inFlightObs); err != nil {
		return fmt.Errorf("register callback of %s: %w", otelnames.MetricMessages, err)
	}
	return nil
}

// observeFlows reports the flows' counters. An outcome that never happened has no point,
// as with a synchronous counter never added to.
func (in *Instrumentation) observeFlows(_ context.Context, m *instruments, o metric.Observer) error {
	in.consumedByQueue.Range(func(_, v any) bool {
		qc := v.(*queueCount)
		o.ObserveInt64(m.consumedObs, qc.n.Load(), qc.obs...)
		return true
	})
	in.flows.Range(func(_, v any) bool {
		f := v.(*flow)
		o.ObserveInt64(m.inFlightObs, f.inFlight.Load(), f.flightObs...)
		for i := range f.counts {
			if n := f.counts[i].Load(); n > 0 {
				o.ObserveInt64(m.messagesObs, n, f.outcomeObs[i]...)
			}
		}
		f.other.Range(func(k, v any) bool {
			opts := in.metricAttrs(metricKey{queue: f.queue, handler: f.handler, outcome: k.(string)})
			o.ObserveInt64(m.messagesObs, v.(*atomic.Int64).Load(), opts.set)
			return true
		})
		return true
	})
	return nil
}
