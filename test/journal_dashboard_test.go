package test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/otelstep"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

// journalMetricPrefix is the Prometheus name prefix of the idempotency journal metrics.
const journalMetricPrefix = "sluice_idempotency_journal_"

// The dashboard's idempotency journal panels read what telemetry exports for the journal,
// under the names the Prometheus exporter gives it, and every journal metric is on a
// panel. TestPaymentsObservedByPrometheus checks the whole dashboard against a real
// Prometheus; this needs neither Prometheus nor a broker, so it runs everywhere, and it
// also fails when a journal metric is added without a panel.
func TestJournalDashboard_PanelsReadWhatTelemetryExports(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	providers, err := otelsetup.Setup(ctx, otelsetup.Config{ServiceName: "journal-dashboard"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = providers.Shutdown(context.Background()) })
	inst, err := otelstep.New(otelstep.Config{TracerProvider: providers.TracerProvider, MeterProvider: providers.MeterProvider})
	require.NoError(t, err)
	reg, err := inst.RegisterJournal(func() otelstep.JournalState {
		return otelstep.JournalState{Restored: 3, RestoreDuration: time.Second, Appended: 2, Failures: 1, Skipped: 1,
			Lag: time.Millisecond, Unconfirmed: 1, Recreated: 1}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Unregister() })

	rec := httptest.NewRecorder()
	providers.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	exported := map[string]bool{}
	for _, l := range strings.Split(rec.Body.String(), "\n") {
		// "# TYPE name kind": a counter's samples are name_total, and so is its TYPE line.
		if f := strings.Fields(l); len(f) == 4 && f[1] == "TYPE" && strings.HasPrefix(f[2], journalMetricPrefix) {
			exported[f[2]] = true
		}
	}
	require.NotEmpty(t, exported, "the journal metrics in the scrape:\n%s", rec.Body.String())

	used := map[string]bool{}
	for _, expr := range dashboardExprs(t) {
		for _, name := range metricNames(expr) {
			if strings.HasPrefix(name, journalMetricPrefix) {
				used[name] = true
			}
		}
	}
	var unknown, unshown []string
	for name := range used {
		if !exported[name] {
			unknown = append(unknown, name)
		}
	}
	for name := range exported {
		if !used[name] {
			unshown = append(unshown, name)
		}
	}
	slices.Sort(unknown)
	slices.Sort(unshown)
	t.Logf("%d journal metrics exported, %d on the dashboard", len(exported), len(used))
	assert.Empty(t, unknown, "journal metrics the dashboard queries but telemetry does not export")
	assert.Empty(t, unshown, "journal metrics telemetry exports but no dashboard panel shows")
}
