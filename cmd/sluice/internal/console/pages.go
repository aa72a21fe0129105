package console

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/sluice-go/sluice/internal/topology"

	"github.com/sluice-go/sluice/dlq"
)

// render executes page with data into a buffer first, so a template error cannot leave
// half a page. Every page gets the CSRF token and who is signed in (r's Identity).
func (s *Server) render(w http.ResponseWriter, r *http.Request, code int, page string, data map[string]any) {
	data["CSRF"] = s.csrf
	id := identityOf(r.Context())
	data["Identity"] = id
	data["CanAct"] = id.Operator()
	data["ReadOnlyMessage"] = ReadOnlyMessage
	if id.Open {
		data["NoAccessControl"] = noAccessControl
	}
	var b bytes.Buffer
	if err := s.pages[page].Execute(&b, data); err != nil {
		s.cfg.Logger.Error("console template failed", "page", page, "error", err)
		http.Error(w, "sluice console: rendering failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(b.Bytes())
}

func (s *Server) pageFail(w http.ResponseWriter, r *http.Request, err error) {
	code := status(err)
	if code >= 500 {
		s.cfg.Logger.Error("console request failed", "path", r.URL.Path, "error", s.mask(err.Error()))
	}
	s.render(w, r, code, "error", map[string]any{"Title": http.StatusText(code), "Status": code, "Error": s.mask(err.Error()), "Queue": r.PathValue("queue")})
}

func (s *Server) overviewPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	ov, err := s.overview(ctx)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "overview", map[string]any{"Title": "Queues", "Overview": ov, "DiscoveryRetry": s.cfg.DiscoveryRetry.String()})
}

func (s *Server) queuePage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	queue := r.PathValue("queue")
	data := map[string]any{"Title": queue, "Queue": queue, "DLQ": topology.DLQ(queue), "Ops": Ops}
	groups, err := dlq.NewInspector(s.cfg.Conn).Groups(ctx, queue)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	data["Groups"] = groups
	if g := r.URL.Query().Get("group"); g != "" {
		recs, _, err := s.groupMessages(ctx, queue, g)
		if err != nil {
			s.pageFail(w, r, err)
			return
		}
		data["Group"] = g
		data["Messages"] = recs
	}
	s.render(w, r, http.StatusOK, "queue", data)
}

func (s *Server) messagePage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	queue, id := r.PathValue("queue"), r.PathValue("id")
	rec, all, err := s.message(ctx, r)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	d := rec.Display()
	s.render(w, r, http.StatusOK, "message", map[string]any{
		"Title": id, "Queue": queue, "Record": d.Record, "Display": d, "Positions": positionsOf(all),
		"Download": downloadPath(queue, rec), "MaskingNote": dlq.MaskingNote, "PreviewBytes": dlq.PreviewBytes,
		"HeaderKeys": slices.Sorted(maps.Keys(d.Record.Headers)), "Timeline": s.timeline(ctx, rec), "Ops": Ops,
	})
}

// message reads the message a page or an API call names: its id, and with ?position=N
// the one at that position when several messages hold the id (else the first). It returns
// every message with the id too.
func (s *Server) message(ctx context.Context, r *http.Request) (dlq.Record, []dlq.Record, error) {
	queue, id := r.PathValue("queue"), r.PathValue("id")
	pos := 0
	if p := r.URL.Query().Get("position"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return dlq.Record{}, nil, fmt.Errorf("position %q is not a position in the queue (1 is the head): %w", p, ErrBadRequest)
		}
		pos = n
	}
	all, err := dlq.NewInspector(s.cfg.Conn).ShowAll(ctx, queue, id)
	if err != nil {
		return dlq.Record{}, nil, err
	}
	if pos == 0 {
		return all[0], all, nil
	}
	for _, rec := range all {
		if rec.Position == pos {
			return rec, all, nil
		}
	}
	return dlq.Record{}, nil, fmt.Errorf("message %q is not at position %d in %s: %w", id, pos, topology.DLQ(queue), dlq.ErrMessageNotFound)
}

// positionsOf lists the positions of recs when there are several, for links to each.
func positionsOf(recs []dlq.Record) []int {
	if len(recs) < 2 {
		return nil
	}
	ps := make([]int, len(recs))
	for i, r := range recs {
		ps[i] = r.Position
	}
	return ps
}

// downloadPath is where the console serves rec's exact payload.
func downloadPath(queue string, rec dlq.Record) string {
	return "/queues/" + url.PathEscape(queue) + "/messages/" + url.PathEscape(rec.ID) + "/payload?position=" + strconv.Itoa(rec.Position)
}

// payloadDownload serves a message's payload byte for byte, unmasked, as an attachment
// the browser saves and never renders (a producer's HTML stays inert).
func (s *Server) payloadDownload(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	rec, _, err := s.message(ctx, r)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	name := "payload-" + strconv.Itoa(rec.Position) + ".bin"
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name}))
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.Itoa(len(rec.Payload)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(rec.Payload)
}

// target reads the message id or group an action page is about.
func target(r *http.Request) (ActionRequest, error) {
	id, group := r.FormValue("id"), r.FormValue("group")
	req := ActionRequest{Group: group}
	if id != "" {
		req.IDs = []string{id}
	}
	_, err := req.selector()
	return req, err
}

// confirmPage asks before an action: it names the op, the queue and what is selected, and
// posts the form that does it.
func (s *Server) confirmPage(w http.ResponseWriter, r *http.Request) {
	queue, op := r.PathValue("queue"), r.URL.Query().Get("op")
	if !slices.Contains(Ops, op) {
		s.pageFail(w, r, fmt.Errorf("unknown action %q (want replay, archive or purge): %w", op, ErrBadRequest))
		return
	}
	req, err := target(r)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	ctx, cancel := s.ctx(r)
	defer cancel()
	// Count what the action would move, so the question says how many and a stale link
	// (the group is gone) is a 404 before anyone confirms.
	n := 0
	if _, err := dlq.NewInspector(s.cfg.Conn).Messages(ctx, queue, dlq.Selector{IDs: req.IDs, Group: req.Group}, func(dlq.Record) bool { n++; return true }); err != nil {
		s.pageFail(w, r, err)
		return
	}
	if n == 0 {
		s.pageFail(w, r, fmt.Errorf("nothing to %s in %s: %w", op, topology.DLQ(queue), dlq.ErrNothingSelected))
		return
	}
	s.render(w, r, http.StatusOK, "confirm", map[string]any{
		"Title": "Confirm " + op, "Queue": queue, "DLQ": topology.DLQ(queue), "Archive": topology.Archive(queue),
		"Op": op, "ID": r.FormValue("id"), "Group": req.Group, "Count": n,
	})
}

// actionForm runs the action a confirmation page posted.
func (s *Server) actionForm(w http.ResponseWriter, r *http.Request) {
	if !s.validCSRF(r.PostFormValue("csrf")) {
		s.render(w, r, http.StatusForbidden, "error", map[string]any{"Title": "Forbidden", "Status": http.StatusForbidden,
			"Error": "this form lacks the console's CSRF token: open the page again and confirm from there"})
		return
	}
	queue, op := r.PathValue("queue"), r.PostFormValue("op")
	req, err := target(r)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	ctx, cancel := s.actionCtx(r)
	defer cancel()
	res, err := s.act(ctx, queue, op, req)
	if err != nil && !errors.Is(err, dlq.ErrMessageNotFound) && !errors.Is(err, dlq.ErrNothingSelected) {
		s.pageFail(w, r, err)
		return
	}
	errText := ""
	if err != nil {
		errText = s.mask(err.Error())
	}
	code := http.StatusOK
	if err != nil {
		code = status(err)
	}
	s.render(w, r, code, "result", map[string]any{"Title": verb(op), "Queue": queue, "Op": op, "Verb": verb(op), "Result": res, "Error": errText, "Group": req.Group, "IDs": req.IDs,
		"Actor": identityOf(r.Context()).Actor()})
}
