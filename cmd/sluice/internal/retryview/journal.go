package retryview

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluice-go/sluice/internal/mask"
	"github.com/sluice-go/sluice/policy"
)

// MetricsPath is where the service's metrics server serves its metrics in Prometheus's
// text format: `sluice journal` and the console's journal page read the journal's figures
// there when PROMETHEUS_URL is not set.
const MetricsPath = "/metrics"

// The idempotency journal metrics (telemetry/journal.go, otelnames.MetricJournal*) under
// the names the Prometheus exporter gives them: dots become underscores, a unit in
// seconds adds _seconds, a counter adds _total. The dashboard's journal row reads the same
// names.
const (
	PromJournalPrefix          = "sluice_idempotency_journal_"
	PromJournalRestoredKeys    = PromJournalPrefix + "restored_keys"
	PromJournalRestoreDuration = PromJournalPrefix + "restore_duration_seconds"
	PromJournalRestoring       = PromJournalPrefix + "restoring"
	PromJournalLag             = PromJournalPrefix + "lag_seconds"
	PromJournalUnconfirmed     = PromJournalPrefix + "unconfirmed"
	PromJournalAppended        = PromJournalPrefix + "appended_total"
	PromJournalFailures        = PromJournalPrefix + "failures_total"
	PromJournalSkipped         = PromJournalPrefix + "skipped_total"
	PromJournalRecreated       = PromJournalPrefix + "recreated_total"
)

// HandlersTimeout bounds Journal's read of the service's description (which handlers
// journal), a complement to the figures.
const HandlersTimeout = 3 * time.Second

// PromJournalQuery is the one instant query the journal figures take from Prometheus:
// every journal series, one per scraped instance and metric.
const PromJournalQuery = `sum by (job, instance, __name__) ({__name__=~"` + PromJournalPrefix + `.+"})`

// The states JournalFigures.State takes.
const (
	// JournalRestoring: a journal has not caught up yet; its handler does not consume.
	JournalRestoring = "restoring"
	// JournalFailing: keys wait to be journaled and appends have failed: their messages
	// are deferred, not acknowledged, until an append succeeds.
	JournalFailing = "failing"
	// JournalReady: restored, and journaling as messages are done.
	JournalReady = "ready"
)

// JournalFigures are one service instance's idempotency journal figures. A service keeps
// its journals in one idempotency step (idempotency.Guard), and the metrics report the
// step's journals together: a restore's figures are over every journal of the instance.
type JournalFigures struct {
	// Instance is Prometheus's job and instance labels ("payments 10.0.0.7:9464"); empty
	// when read from the service itself.
	Instance string `json:"instance,omitempty"`
	// State is JournalRestoring, JournalFailing or JournalReady.
	State string `json:"state"`
	// Restoring is how many journals have not caught up yet.
	Restoring int64 `json:"restoring"`
	// RestoredKeys is how many keys the restores at start read; RestoreDuration the
	// longest restore.
	RestoredKeys    int64           `json:"restored_keys"`
	RestoreDuration policy.Duration `json:"restore_duration"`
	// Lag is the age of the last record applied from the journal: how long a key done on
	// another instance took to be known here (the tail's delay).
	Lag policy.Duration `json:"lag"`
	// Unconfirmed is how many keys are done but not journaled yet.
	Unconfirmed int64 `json:"unconfirmed"`
	// Appended counts records confirmed, Failures appends that failed, Skipped journal
	// messages that were not records (corrupt, foreign), Recreated journal streams found
	// deleted and declared again; all since the instance started.
	Appended  int64 `json:"appended"`
	Failures  int64 `json:"failures"`
	Skipped   int64 `json:"skipped"`
	Recreated int64 `json:"recreated"`
}

// JournalHandler is a handler that journals its done keys, from the service's description.
type JournalHandler struct {
	Name  string `json:"name"`
	Queue string `json:"queue"`
	// Journal is the stream (or, for a partitioned queue, the streams) the keys go to.
	Journal string `json:"journal"`
}

// Journal is what `sluice journal --json` prints and the console's journal API serves:
// the handlers with a journal and their instances' figures, and where both were read.
type Journal struct {
	// Source is SourceService or SourcePrometheus; URL the address the figures were read
	// from, its password masked.
	Source string `json:"source"`
	URL    string `json:"url"`
	// Handlers are the handlers with a journal, from the service's description
	// (PolicyPath, read at HandlersURL); nil when it could not be read (HandlersNote says
	// why), empty when no handler keeps one.
	Handlers     []JournalHandler `json:"handlers"`
	HandlersURL  string           `json:"handlers_url,omitempty"`
	HandlersNote string           `json:"handlers_note,omitempty"`
	// Instances are the figures, one per instance; empty when the source has none.
	Instances []JournalFigures `json:"instances"`
}

// Describe says where j's figures were read, as Retries.Describe does.
func (j Journal) Describe() string {
	if j.Source == SourcePrometheus {
		return "Prometheus at " + j.URL
	}
	return "the service at " + j.URL
}

// HandlersKnown reports whether the service's description was read.
func (j Journal) HandlersKnown() bool { return j.Handlers != nil }

// NoJournal says, in a sentence, why there is nothing to show, or "" when there is: the
// service's description names no handler with a journal, or the source has no journal
// figures.
func (j Journal) NoJournal() string {
	switch {
	case j.HandlersKnown() && len(j.Handlers) == 0:
		return "No handler of the service journals its idempotency keys: it has no idempotency step, " +
			"or its broker keeps no journal (RabbitMQ's does), or the journal is turned off (IDEMPOTENCY_JOURNAL=off in the payments example)."
	case len(j.Instances) == 0 && j.Source == SourcePrometheus:
		return "Prometheus has no " + PromJournalPrefix + "* series: no service it scrapes reports an idempotency journal."
	case len(j.Instances) == 0:
		return "The service reports no " + PromJournalPrefix + "* metrics: it journals none, " +
			"or does not register them (otelsetup.Operate does; else telemetry's Instrumentation.RegisterJournal)."
	}
	return ""
}

// HandlerNames returns the names of the handlers with a journal, joined, or "–" when the
// service's description could not be read.
func (j Journal) HandlerNames() string {
	if !j.HandlersKnown() {
		return "–"
	}
	names := make([]string, len(j.Handlers))
	for i, h := range j.Handlers {
		names[i] = h.Name
	}
	return strings.Join(names, ", ")
}

// Journal reads the idempotency journal's figures: from Prometheus when PrometheusURL is
// set, else from the service's metrics (MetricsPath); and, from the service, which
// handlers journal (its description), which a missing or older service leaves unknown
// rather than failing. Errors are about the figures' source, its password masked.
func (s Source) Journal(ctx context.Context) (Journal, error) {
	var out Journal
	if prom := strings.TrimSpace(s.PrometheusURL); prom != "" {
		out.Source, out.URL = SourcePrometheus, mask.URL(prom)
		samples, err := s.promQuery(ctx, prom, PromJournalQuery)
		if err != nil {
			return out, maskErr(err, prom)
		}
		out.Instances = promJournal(samples)
	} else {
		base := s.Service()
		u, err := EndpointURL(base, MetricsPath, nil)
		if err != nil {
			return out, err
		}
		out.Source, out.URL = SourceService, mask.URL(u)
		fams, err := getMetrics(ctx, s.client(), u)
		if err != nil {
			return out, maskErr(err, base)
		}
		if f, ok := serviceJournal(fams); ok {
			out.Instances = []JournalFigures{f}
		}
	}
	if out.Instances == nil {
		out.Instances = []JournalFigures{}
	}
	// The names are a complement: a service that does not answer soon must not hold the
	// figures up for the whole timeout.
	pctx, cancel := context.WithTimeout(ctx, HandlersTimeout)
	defer cancel()
	pol, err := s.Policy(pctx)
	out.HandlersURL = pol.URL
	if err != nil {
		// The figures stand without the names: say why they are missing.
		out.HandlersNote = "The handlers with a journal are the service's own and could not be read: " + mask.Text(err.Error(), s.Service())
		return out, nil
	}
	out.Handlers = []JournalHandler{}
	for _, h := range pol.Handlers {
		if h.Idempotency != nil && h.Idempotency.Journal != "" {
			out.Handlers = append(out.Handlers, JournalHandler{Name: h.Name, Queue: h.Queue, Journal: h.Idempotency.Journal})
		}
	}
	if len(out.Handlers) == 0 {
		// A service whose step keeps no journal may still export the metrics, all zero
		// (the payments example with IDEMPOTENCY_JOURNAL=off): they say nothing.
		out.Instances = []JournalFigures{}
	}
	return out, nil
}

// set fills f's field of a journal metric name with v; false for a name it does not
// know.
func (f *JournalFigures) set(name string, v float64) bool {
	seconds := func() policy.Duration {
		return policy.Duration(time.Duration(v * float64(time.Second)).Round(time.Millisecond))
	}
	n := int64(v + 0.5)
	switch name {
	case PromJournalRestoredKeys:
		f.RestoredKeys = n
	case PromJournalRestoreDuration:
		f.RestoreDuration = seconds()
	case PromJournalRestoring:
		f.Restoring = n
	case PromJournalLag:
		f.Lag = seconds()
	case PromJournalUnconfirmed:
		f.Unconfirmed = n
	case PromJournalAppended:
		f.Appended = n
	case PromJournalFailures:
		f.Failures = n
	case PromJournalSkipped:
		f.Skipped = n
	case PromJournalRecreated:
		f.Recreated = n
	default:
		return false
	}
	return true
}

// finish sets f.State from its figures.
func (f *JournalFigures) finish() {
	switch {
	case f.Restoring > 0:
		f.State = JournalRestoring
	case f.Unconfirmed > 0 && f.Failures > 0:
		f.State = JournalFailing
	default:
		f.State = JournalReady
	}
}

// promJournal groups the samples of PromJournalQuery by instance.
func promJournal(samples []promSample) []JournalFigures {
	byInstance := map[string]*JournalFigures{}
	for _, smp := range samples {
		inst := strings.TrimSpace(smp.metric["job"] + " " + smp.metric["instance"])
		f := byInstance[inst]
		if f == nil {
			f = &JournalFigures{Instance: inst}
		}
		if f.set(smp.metric["__name__"], smp.value) {
			byInstance[inst] = f
		}
	}
	out := make([]JournalFigures, 0, len(byInstance))
	for _, f := range byInstance {
		f.finish()
		out = append(out, *f)
	}
	slices.SortFunc(out, func(a, b JournalFigures) int { return strings.Compare(a.Instance, b.Instance) })
	return out
}

// serviceJournal sums the journal families of a scrape; false when it has none.
func serviceJournal(fams map[string]*dto.MetricFamily) (JournalFigures, bool) {
	var f JournalFigures
	found := false
	for name, fam := range fams {
		if !strings.HasPrefix(name, PromJournalPrefix) {
			continue
		}
		var v float64
		for _, m := range fam.GetMetric() {
			switch {
			case m.GetGauge() != nil:
				v += m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				v += m.GetCounter().GetValue()
			case m.GetUntyped() != nil:
				v += m.GetUntyped().GetValue()
			}
		}
		// The text format names a counter's family without _total in some exporters'
		// versions: accept both.
		if f.set(name, v) || (!strings.HasSuffix(name, "_total") && f.set(name+"_total", v)) {
			found = true
		}
	}
	f.finish()
	return f, found
}

// getMetrics reads u, a metrics endpoint, in Prometheus's text format.
func getMetrics(ctx context.Context, client *http.Client, u string) (map[string]*dto.MetricFamily, error) {
	// The plain text format, which every exporter serves, rather than protobuf.
	body, err := get(ctx, client, u, "the service", "text/plain;version=0.0.4")
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("the service at %s answered something other than metrics in Prometheus's text format (%v): is SLUICE_SERVICE_URL the service's METRICS_ADDR?", mask.URL(u), err)
	}
	return fams, nil
}
