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

	"github.com/sluice-go/sluice/internal/dlqview"
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
	f, err := parseFilter(r)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	ctx, cancel := s.ctx(r)
	defer cancel()
	queue := r.PathValue("queue")
	data := map[string]any{"Title": queue, "Queue": queue, "DLQ": topology.DLQ(queue), "Source": sourceQueue(f.Source, queue),
		"Archive": topology.Archive(queue), "Ops": opsFor(f.Source), "Filter": f, "SourceParam": f.SourceParam()}
	groups, err := s.inspector(f.Source).Groups(ctx, queue)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	data["Groups"] = groups
	types := []string{}
	total := 0
	for _, g := range groups {
		total += g.Count
		if !slices.Contains(types, g.ErrorType) {
			types = append(types, g.ErrorType)
		}
	}
	slices.Sort(types)
	if f.ErrorType != "" && !slices.Contains(types, f.ErrorType) {
		types = append(types, f.ErrorType)
	}
	data["ErrorTypes"], data["GroupTotal"] = types, total
	l, err := s.listMessages(ctx, queue, f)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	data["Listing"] = l
	data["Group"] = f.Group
	s.render(w, r, http.StatusOK, "queue", data)
}

// sourceOf is the source a message page or download names (?source=archive), the DLQ
// when it names none or a wrong one.
func sourceOf(r *http.Request) dlq.Source {
	src, _ := parseSource(r.URL.Query().Get("source"))
	return src
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
	src := sourceOf(r)
	d := dlqview.Of(dlqview.Record(rec))
	preview, pretty := prettyJSON(d.Preview, rec.Properties.ContentType, d.PayloadTruncated)
	data := map[string]any{
		"Title": id, "Queue": queue, "Record": d.Record, "Display": d, "Positions": positionsOf(all),
		"Download": downloadPath(queue, rec, src), "MaskingNote": dlqview.MaskingNote, "PreviewBytes": dlqview.PreviewBytes,
		"HeaderKeys": slices.Sorted(maps.Keys(d.Record.Headers)), "Timeline": s.timeline(ctx, rec), "Ops": opsFor(src),
		"Preview": preview, "Pretty": pretty, "Archived": src == dlq.FromArchive, "Source": sourceQueue(src, queue),
		"SourceParam":  map[bool]string{true: sourceArchive}[src == dlq.FromArchive],
		"Compensation": dlqview.Compensation(d.Record),
	}
	if src == dlq.FromDLQ {
		data["Edit"] = newEditForm(rec, all, r.URL.Query().Get("edit") == "" || !identityOf(ctx).Operator())
	}
	s.render(w, r, http.StatusOK, "message", data)
}

// message reads the message a page or an API call names: its id in the DLQ (or, with
// ?source=archive, the archive), and with ?position=N the one at that position when
// several messages hold the id (else the first). It returns every message with the id too.
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
	src, err := parseSource(r.URL.Query().Get("source"))
	if err != nil {
		return dlq.Record{}, nil, err
	}
	all, err := s.inspector(src).Show(ctx, queue, id)
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
	return dlq.Record{}, nil, fmt.Errorf("message %q is not at position %d in %s: %w", id, pos, sourceQueue(src, queue), dlq.ErrMessageNotFound)
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
func downloadPath(queue string, rec dlq.Record, src dlq.Source) string {
	p := "/queues/" + url.PathEscape(queue) + "/messages/" + url.PathEscape(rec.ID) + "/payload?position=" + strconv.Itoa(rec.Position)
	if src == dlq.FromArchive {
		p += "&source=" + sourceArchive
	}
	return p
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

// target reads the message ids (one or several, from the selection's checkboxes) or the
// group an action page is about, and its source.
func target(r *http.Request) (ActionRequest, error) {
	if err := r.ParseForm(); err != nil {
		return ActionRequest{}, fmt.Errorf("form: %w: %w", err, ErrBadRequest)
	}
	req := ActionRequest{Group: r.Form.Get("group"), Source: r.Form.Get("source"), Compensated: r.Form.Get("compensated") == "yes"}
	for _, id := range r.Form["id"] {
		if !slices.Contains(req.IDs, id) {
			req.IDs = append(req.IDs, id)
		}
	}
	if _, err := parseSource(req.Source); err != nil {
		return req, err
	}
	_, err := req.selector()
	return req, err
}

// confirmPage asks before an action: it names the op, the queue and what is selected, and
// posts the form that does it.
func (s *Server) confirmPage(w http.ResponseWriter, r *http.Request) {
	queue, op := r.PathValue("queue"), r.URL.Query().Get("op")
	if !knownOp(op) {
		s.pageFail(w, r, fmt.Errorf("unknown action %q (want replay, archive, purge or restore): %w", op, ErrBadRequest))
		return
	}
	req, err := target(r)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	src, _ := parseSource(req.Source)
	if op == "restore" {
		src, req.Source = dlq.FromArchive, sourceArchive
	}
	ctx, cancel := s.ctx(r)
	defer cancel()
	// Count what the action would move, so the question says how many and a stale link
	// (the group is gone) is a 404 before anyone confirms; a replay or restore of
	// compensated dead letters asks for one more confirmation, naming their events.
	n := 0
	var compensated []dlq.Record
	if _, err := s.inspector(src).Messages(ctx, queue, dlq.Selector{IDs: req.IDs, Group: req.Group}, func(rec dlq.Record) bool {
		n++
		if rec.CompensationID != "" && (op == "replay" || op == "restore") {
			rec.Payload = nil
			compensated = append(compensated, rec)
		}
		return true
	}); err != nil {
		s.pageFail(w, r, err)
		return
	}
	if n == 0 {
		s.pageFail(w, r, fmt.Errorf("nothing to %s in %s: %w", op, sourceQueue(src, queue), dlq.ErrNothingSelected))
		return
	}
	shown := req.IDs
	if len(shown) > 20 {
		shown = shown[:20]
	}
	s.render(w, r, http.StatusOK, "confirm", map[string]any{
		"Title": "Confirm " + op, "Queue": queue, "DLQ": sourceQueue(src, queue), "Archive": topology.Archive(queue),
		"Op": op, "IDs": req.IDs, "Shown": shown, "More": len(req.IDs) - len(shown), "Group": req.Group, "Count": n,
		"SourceParam": req.Source, "Compensated": compensatedRows(compensated), "CompensatedCount": len(compensated),
		"CompensatedMore": max(len(compensated)-maxCompensatedShown, 0),
	})
}

// compensatedRow is a compensated dead letter as the confirmation page names it.
type compensatedRow struct {
	ID, Compensation string
}

// maxCompensatedShown is how many compensated messages a confirmation page names.
const maxCompensatedShown = 20

// compensatedRows names the compensation events of recs' first maxCompensatedShown, masked
// and bounded as the message page shows them.
func compensatedRows(recs []dlq.Record) []compensatedRow {
	var rows []compensatedRow
	for _, rec := range recs[:min(len(recs), maxCompensatedShown)] {
		d := dlqview.Of(dlqview.Record(rec)).Record
		rows = append(rows, compensatedRow{ID: d.ID, Compensation: dlqview.Compensation(d)})
	}
	return rows
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
	if err != nil && !errors.Is(err, dlq.ErrMessageNotFound) && !errors.Is(err, dlq.ErrNothingSelected) && !errors.Is(err, dlq.ErrCompensated) {
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
