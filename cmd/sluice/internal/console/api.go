package console

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/sluice-go/sluice/internal/dlqview"
	"github.com/sluice-go/sluice/internal/topology"

	"github.com/sluice-go/sluice/dlq"
)

// apiError is the body of every API error.
type apiError struct {
	Error  string `json:"error"`
	Status int    `json:"status"`
}

func (s *Server) writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func (s *Server) apiFail(w http.ResponseWriter, r *http.Request, err error) {
	code := status(err)
	if code >= 500 {
		s.cfg.Logger.Error("console request failed", "path", r.URL.Path, "error", s.mask(err.Error()))
	}
	s.writeJSON(w, code, apiError{Error: s.mask(err.Error()), Status: code})
}

func (s *Server) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), s.cfg.Timeout)
}

// actionTimeout bounds one action: a group can hold many thousand messages, moved in
// confirmed batches, so an action gets longer than a read.
const actionTimeout = 10 * time.Minute

func (s *Server) actionCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), max(s.cfg.Timeout, actionTimeout))
}

func (s *Server) apiCSRF(w http.ResponseWriter, _ *http.Request) {
	s.writeJSON(w, http.StatusOK, map[string]string{"token": s.csrf, "header": CSRFHeader})
}

func (s *Server) apiQueues(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	ov, err := s.overview(ctx)
	if err != nil {
		s.apiFail(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, ov)
}

func (s *Server) apiGroups(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	src, err := parseSource(r.URL.Query().Get("source"))
	if err != nil {
		s.apiFail(w, r, err)
		return
	}
	queue := r.PathValue("queue")
	var total int
	groups, err := s.inspector(src).Groups(ctx, queue)
	if err != nil {
		s.apiFail(w, r, err)
		return
	}
	if groups == nil {
		groups = []dlq.Group{}
	}
	for _, g := range groups {
		total += g.Count
	}
	s.writeJSON(w, http.StatusOK, map[string]any{"queue": queue, "dlq": topology.DLQ(queue), "source": sourceQueue(src, queue), "total": total, "groups": groups})
}

// apiMessages lists one page of a DLQ's (or archive's) messages, filtered as the queue
// page filters them: ?source=archive, ?group=, ?error_type=, ?older_than=, ?q=, ?page=.
func (s *Server) apiMessages(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r)
	if err != nil {
		s.apiFail(w, r, err)
		return
	}
	ctx, cancel := s.ctx(r)
	defer cancel()
	queue := r.PathValue("queue")
	l, err := s.listMessages(ctx, queue, f)
	if err != nil {
		s.apiFail(w, r, err)
		return
	}
	// Summaries only: 200 messages of 20 MB each stay a small response; a message's
	// headers and payload preview are at .../messages/{id}.
	s.writeJSON(w, http.StatusOK, struct {
		Queue  string `json:"queue"`
		Source string `json:"source"`
		Listing
	}{queue, sourceQueue(f.Source, queue), l})
}

func (s *Server) apiMessage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	rec, _, err := s.message(ctx, r)
	if err != nil {
		s.apiFail(w, r, err)
		return
	}
	d := dlqview.Of(dlqview.Record(rec))
	d.Download = downloadPath(r.PathValue("queue"), rec, sourceOf(r))
	s.writeJSON(w, http.StatusOK, d)
}

// apiAction runs POST /api/v1/queues/{queue}/{replay|archive|purge} with an ActionRequest
// body and the CSRF token in the X-CSRF-Token header.
func (s *Server) apiAction(w http.ResponseWriter, r *http.Request) {
	if !s.validCSRF(r.Header.Get(CSRFHeader)) {
		s.writeJSON(w, http.StatusForbidden, apiError{Error: "missing or wrong " + CSRFHeader + " header (GET /api/v1/csrf gives the token)", Status: http.StatusForbidden})
		return
	}
	op := r.PathValue("op")
	if !knownOp(op) {
		s.writeJSON(w, http.StatusNotFound, apiError{Error: "unknown action " + op + " (want replay, archive, purge or restore)", Status: http.StatusNotFound})
		return
	}
	var req ActionRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		s.writeJSON(w, http.StatusBadRequest, apiError{Error: "bad JSON body: " + err.Error(), Status: http.StatusBadRequest})
		return
	}
	ctx, cancel := s.actionCtx(r)
	defer cancel()
	res, err := s.act(ctx, r.PathValue("queue"), op, req)
	if err != nil {
		s.apiFail(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, ActionResult{Result: res, Actor: identityOf(r.Context()).Actor()})
}
