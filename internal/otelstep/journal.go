package otelstep

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-go/sluice/internal/otelnames"
)

// JournalState is what the idempotency journal metrics read at each collection: the
// idempotency.Guard's Stats().Journal and the broker's count of streams declared again.
type JournalState struct {
	// Restoring is how many journals have not caught up yet.
	Restoring int
	// Restored is how many keys the restores read.
	Restored int64
	// RestoreDuration is the longest restore.
	RestoreDuration time.Duration
	// Appended, Failures and Skipped count records confirmed, appends failed and journal
	// messages that were not records.
	Appended, Failures, Skipped int64
	// Lag is the age of the last record applied from the journal.
	Lag time.Duration
	// Unconfirmed is how many keys are done but not journaled yet.
	Unconfirmed int
	// Recreated counts journal streams found deleted and declared again.
	Recreated int64
}

// RegisterJournal makes the sluice.idempotency.journal.* metrics report state() at every
// collection. Unregister the returned registration when the Guard is closed.
func (in *Instrumentation) RegisterJournal(state func() JournalState) (metric.Registration, error) {
	if state == nil {
		return nil, fmt.Errorf("register %s: state function is nil", otelnames.MetricJournalRestoredKeys)
	}
	type gauge struct {
		name, desc, unit string
		read             func(JournalState) float64
	}
	gauges := []gauge{
		{name: otelnames.MetricJournalRestoredKeys, desc: "Idempotency keys read from the journals when restoring.", unit: "{key}",
			read: func(s JournalState) float64 { return float64(s.Restored) }},
		{name: otelnames.MetricJournalRestoreDuration, desc: "The longest restore of an idempotency journal.", unit: "s",
			read: func(s JournalState) float64 { return s.RestoreDuration.Seconds() }},
		{name: otelnames.MetricJournalRestoring, desc: "Idempotency journals not caught up yet (their handlers do not consume).", unit: "{journal}",
			read: func(s JournalState) float64 { return float64(s.Restoring) }},
		{name: otelnames.MetricJournalLag, desc: "Age of the last idempotency journal record applied: how long a key done elsewhere took to be known here.", unit: "s",
			read: func(s JournalState) float64 { return s.Lag.Seconds() }},
		{name: otelnames.MetricJournalUnconfirmed, desc: "Keys done but not journaled yet: their messages are deferred, not acknowledged.", unit: "{key}",
			read: func(s JournalState) float64 { return float64(s.Unconfirmed) }},
	}
	type counter struct {
		name, desc, unit string
		read             func(JournalState) int64
	}
	counters := []counter{
		{name: otelnames.MetricJournalAppended, desc: "Idempotency journal records confirmed by the broker.", unit: "{record}",
			read: func(s JournalState) int64 { return s.Appended }},
		{name: otelnames.MetricJournalFailures, desc: "Idempotency journal appends that failed.", unit: "{append}",
			read: func(s JournalState) int64 { return s.Failures }},
		{name: otelnames.MetricJournalSkipped, desc: "Idempotency journal messages skipped as not record batches.", unit: "{message}",
			read: func(s JournalState) int64 { return s.Skipped }},
		{name: otelnames.MetricJournalRecreated, desc: "Idempotency journal streams found deleted and declared again.", unit: "{stream}",
			read: func(s JournalState) int64 { return s.Recreated }},
	}
	return in.register(func(m *instruments) (metric.Registration, error) {
		// The instruments of m, in the order of gauges and counters.
		var all []metric.Observable
		gaugeInsts := make([]metric.Float64Observable, len(gauges))
		for i, g := range gauges {
			inst, err := m.meter.Float64ObservableGauge(g.name, metric.WithDescription(g.desc), metric.WithUnit(g.unit))
			if err != nil {
				return nil, fmt.Errorf("create gauge %s: %w", g.name, err)
			}
			gaugeInsts[i] = inst
			all = append(all, inst)
		}
		counterInsts := make([]metric.Int64Observable, len(counters))
		for i, c := range counters {
			inst, err := m.meter.Int64ObservableCounter(c.name, metric.WithDescription(c.desc), metric.WithUnit(c.unit))
			if err != nil {
				return nil, fmt.Errorf("create counter %s: %w", c.name, err)
			}
			counterInsts[i] = inst
			all = append(all, inst)
		}
		reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			s := state()
			for i, g := range gauges {
				o.ObserveFloat64(gaugeInsts[i], g.read(s))
			}
			for i, c := range counters {
				o.ObserveInt64(counterInsts[i], c.read(s))
			}
			return nil
		}, all...)
		if err != nil {
			return nil, fmt.Errorf("register idempotency journal metrics callback: %w", err)
		}
		return reg, nil
	})
}
