package console

import (
	"net/http"
	"strconv"

	"github.com/sluice-go/sluice/cmd/sluice/internal/retryview"
)

// JournalRow is one instance's idempotency journal figures as the journal page shows them.
type JournalRow struct {
	// Instance is Prometheus's job and instance, "this service" when read from the
	// service itself.
	Instance string
	// Handlers are the handlers whose journals the figures cover ("–" when unknown).
	Handlers string
	State    string
	// Failing marks a state an operator must look at (restoring, failing).
	Failing                      bool
	Restoring                    int64
	RestoredKeys                 int64
	RestoreDuration, Lag         string
	Unconfirmed, Appended        int64
	Failures, Skipped, Recreated int64
}

// journalRows formats j's instances.
func journalRows(j retryview.Journal) []JournalRow {
	rows := make([]JournalRow, 0, len(j.Instances))
	for _, f := range j.Instances {
		inst := f.Instance
		if inst == "" {
			inst = "this service"
		}
		rows = append(rows, JournalRow{
			Instance: inst, Handlers: j.HandlerNames(), State: f.State, Failing: f.State != retryview.JournalReady,
			Restoring: f.Restoring, RestoredKeys: f.RestoredKeys, RestoreDuration: f.RestoreDuration.String(), Lag: f.Lag.String(),
			Unconfirmed: f.Unconfirmed, Appended: f.Appended, Failures: f.Failures, Skipped: f.Skipped, Recreated: f.Recreated,
		})
	}
	return rows
}

// journalSource says where the journal page reads before it has read: Prometheus, or the
// service's metrics.
func (s *Server) journalSource() string {
	src := s.retrySource()
	if src.PrometheusURL != "" {
		return src.Describe()
	}
	if u, err := retryview.EndpointURL(src.Service(), retryview.MetricsPath, nil); err == nil {
		return "the service at " + s.mask(u)
	}
	return "the service at " + s.mask(src.Service())
}

// journalPage serves GET /journal: each instance's idempotency journal figures, the
// handlers they cover, and where they were read. A service without a journal is a page
// that says so, not an error.
func (s *Server) journalPage(w http.ResponseWriter, r *http.Request) {
	data := map[string]any{"Title": "Idempotency journal", "Source": s.journalSource(), "Prometheus": s.cfg.PrometheusURL != ""}
	ctx, cancel := s.ctx(r)
	defer cancel()
	j, err := s.retrySource().Journal(ctx)
	if err != nil {
		code, msg := s.sourceFailed(err)
		s.cfg.Logger.Warn("console: idempotency journal figures unavailable", "path", r.URL.Path, "error", msg)
		data["Error"] = msg
		s.render(w, r, code, "journal", data)
		return
	}
	data["Source"] = j.Describe()
	data["NoJournal"] = j.NoJournal()
	data["Handlers"] = j.Handlers
	data["HandlersNote"] = s.mask(j.HandlersNote)
	data["HandlersURL"] = j.HandlersURL
	data["Rows"] = journalRows(j)
	data["Shared"] = len(j.Handlers) > 1
	data["HandlerCount"] = strconv.Itoa(len(j.Handlers))
	s.render(w, r, http.StatusOK, "journal", data)
}

// apiJournal serves GET /api/v1/journal: the figures as `sluice journal --json` prints them.
func (s *Server) apiJournal(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	j, err := s.retrySource().Journal(ctx)
	if err != nil {
		code, msg := s.sourceFailed(err)
		s.writeJSON(w, code, apiError{Error: msg, Status: code})
		return
	}
	j.HandlersNote = s.mask(j.HandlersNote)
	s.writeJSON(w, http.StatusOK, j)
}
