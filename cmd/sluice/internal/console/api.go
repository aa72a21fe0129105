package console

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/sluice-go/sluice/internal/topology"

	"github.com/sluice-go/sluice/dlq"
)

// maxListed bounds the messages a group's listing returns.
const maxListed = 200

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
	groups, err := dlq.NewInspector(s.cfg.Conn).Groups(ctx, r.PathValue("queue"))
	if err != nil {
		s.apiFail(w, r, err)
		return
	}
	if groups == nil {
		groups = []dlq.Group{}
	}
	s.writeJSON(w, http.StatusOK, map[string]any{"queue": r.PathValue("queue"), "dlq": topology.DLQ(r.PathValue("queue")), "groups": groups})
}

// groupMessages returns the summaries of up to maxListed messages of group in queue's DLQ
// (all when group is empty), and the DLQ's depth. Only summaries are kept: 200 dead
// letters of 20 MB each cost no more memory than one.
func (s *Server) groupMessages(ctx context.Context, queue, group string) ([]dlq.Summary, int, error) {
	recs := []dlq.Summary{}
	total, err := dlq.NewInspector(s.cfg.Conn).Messages(ctx, queue, dlq.Selector{Group: group}, func(rec dlq.Record) bool {
		recs = append(recs, rec.Summary())
		return len(recs) < maxListed
	})
	if err == nil && group != "" && len(recs) == 0 {
		err = errors.Join(dlq.ErrNothingSelected, errors.New("no message of group "+group+" in "+topology.DLQ(queue)))
	}
	return recs, total, err
}

func (s *Server) apiMessages(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	recs, total, err := s.groupMessages(ctx, r.PathValue("queue"), r.URL.Query().Get("group"))
	if err != nil {
		s.apiFail(w, r, err)
		return
	}
	// Summaries only: 200 messages of 20 MB each stay a small response; a message's
	// headers and payload preview are at .../messages/{id}.
	s.writeJSON(w, http.StatusOK, map[string]any{"queue": r.PathValue("queue"), "total": total, "messages": recs})
}

func (s *Server) apiMessage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	rec, _, err := s.message(ctx, r)
	if err != nil {
		s.apiFail(w, r, err)
		return
	}
	d := rec.Display()
	d.Download = downloadPath(r.PathValue("queue"), rec)
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
	if !slices.Contains(Ops, op) {
		s.writeJSON(w, http.StatusNotFound, apiError{Error: "unknown action " + op + " (want replay, archive or purge)", Status: http.StatusNotFound})
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
