package console

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/topology"
)

// auditFilter is what the audit page and GET /api/v1/audit show: ?queue= and ?since= (an
// age such as 24h or 7d).
type auditFilter struct {
	Queue string
	Since string
	since time.Duration
}

func parseAuditFilter(r *http.Request) (auditFilter, error) {
	f := auditFilter{Queue: strings.TrimSpace(r.URL.Query().Get("queue")), Since: strings.TrimSpace(r.URL.Query().Get("since"))}
	if f.Since != "" {
		d, err := parseAge(f.Since)
		if err != nil || d <= 0 {
			return f, fmt.Errorf("since=%q is not an age such as 1h, 24h or 7d: %w", f.Since, ErrBadRequest)
		}
		f.since = d
	}
	return f, nil
}

// auditExchange is the exchange the console records on and reads.
func (s *Server) auditExchange() string {
	if s.cfg.AuditExchange != "" {
		return s.cfg.AuditExchange
	}
	return topology.Audit
}

// audit reads the trail's events f selects, newest first.
func (s *Server) audit(r *http.Request, f auditFilter) ([]dlq.AuditEvent, error) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	q := dlq.AuditQuery{Exchange: s.cfg.AuditExchange, Queue: f.Queue}
	if f.since > 0 {
		q.Since = time.Now().Add(-f.since)
	}
	events, err := dlq.ReadAudit(ctx, s.cfg.Conn, q)
	if err != nil {
		return nil, err
	}
	slices.Reverse(events)
	return events, nil
}

// auditPage lists the audit trail, newest first.
func (s *Server) auditPage(w http.ResponseWriter, r *http.Request) {
	f, err := parseAuditFilter(r)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	events, err := s.audit(r, f)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	rows := make([]auditRow, len(events))
	for i, ev := range events {
		rows[i] = newAuditRow(ev)
	}
	s.render(w, r, http.StatusOK, "audit", map[string]any{"Title": "Audit trail", "Events": rows, "Filter": f,
		"Exchange": s.auditExchange(), "Sinces": []string{"1h", "24h", "7d", "30d"}})
}

// auditRow is one event as the audit page shows it.
type auditRow struct {
	dlq.AuditEvent
	// Took is how long the action ran, "" when it has not recorded its end.
	Took string
	// ShownIDs are the first ids; MoreIDs how many of Count are not shown.
	ShownIDs []string
	MoreIDs  int
}

// auditShownIDs is how many ids a row shows.
const auditShownIDs = 5

func newAuditRow(ev dlq.AuditEvent) auditRow {
	row := auditRow{AuditEvent: ev, ShownIDs: ev.IDs}
	if ev.Ended != nil {
		row.Took = ev.Ended.Sub(ev.At).Round(time.Millisecond).String()
	}
	if len(row.ShownIDs) > auditShownIDs {
		row.ShownIDs = row.ShownIDs[:auditShownIDs]
	}
	row.MoreIDs = max(ev.Count, len(ev.IDs)) - len(row.ShownIDs)
	return row
}

// apiAudit returns the audit trail's events, newest first.
func (s *Server) apiAudit(w http.ResponseWriter, r *http.Request) {
	f, err := parseAuditFilter(r)
	if err != nil {
		s.apiFail(w, r, err)
		return
	}
	events, err := s.audit(r, f)
	if err != nil {
		s.apiFail(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, map[string]any{"exchange": s.auditExchange(), "queue": f.Queue, "since": f.Since, "events": events})
}
