package console

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/dlqview"
	"github.com/sluice-go/sluice/internal/dlqwire"
	"github.com/sluice-go/sluice/internal/mask"
	"github.com/sluice-go/sluice/internal/topology"
)

// Edit-and-retry: the message page's form posts the edited payload and headers to a
// preview (the diff, the header changes, dlqwire.CheckEdit's verdict), whose Confirm
// posts them, base64-encoded, to the edit itself (dlq.Operator.Edit): a corrected copy to
// the original queue, the original to Q.dlq.archive, in one transaction.

// Request body bounds of an edit: a payload of at most dlqwire.MaxEditPayload, its headers, and
// room for the encoding (JSON's escapes; the confirm form's base64).
const (
	apiEditBody  = dlqwire.MaxEditPayload + dlqwire.MaxEditPayload/4
	formEditBody = dlqwire.MaxEditPayload + dlqwire.MaxEditPayload/2
)

// EditRequest is the body of POST /api/v1/queues/{queue}/messages/{id}/edit.
type EditRequest struct {
	// Payload replaces the payload; omitted (null) keeps it.
	Payload *string `json:"payload,omitempty"`
	// Compensated confirms editing a dead letter whose compensation event was published
	// (dlq.Options.Compensated); without it such an edit is refused (409).
	Compensated bool `json:"compensated,omitempty"`
	// SetHeaders sets headers; UnsetHeaders removes them.
	SetHeaders   map[string]string `json:"set_headers,omitempty"`
	UnsetHeaders []string          `json:"unset_headers,omitempty"`
}

// EditResponse is the body of a successful edit: what dlq.Operator.Edit did, and who did
// it.
type EditResponse struct {
	dlq.EditResult
	// Actor is "console:<token name>".
	Actor string `json:"actor"`
}

// isJSONType reports whether contentType is JSON (application/json or any +json type).
func isJSONType(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// prettyJSON returns text indented when it is a whole JSON payload (a JSON content type,
// or none and an object or array), and whether it was.
func prettyJSON(text, contentType string, truncated bool) (string, bool) {
	if truncated {
		return text, false
	}
	trimmed := strings.TrimSpace(text)
	jsonish := isJSONType(contentType) ||
		(contentType == "" && (strings.HasPrefix(trimmed, "{") || strings.HasPrefix(trimmed, "[")))
	if !jsonish || !json.Valid([]byte(trimmed)) {
		return text, false
	}
	var b bytes.Buffer
	if err := json.Indent(&b, []byte(trimmed), "", "  "); err != nil {
		return text, false
	}
	return b.String(), true
}

// EditForm is the message page's edit-and-retry form.
type EditForm struct {
	// ID is the message's id; Position the position of the message an edit changes (the
	// first with the id); Others how many more hold the id.
	ID       string
	Position int
	Others   int
	// Payload is the editor's text: the exact payload, JSON indented (Pretty) when its
	// content type is JSON and it parses. Editable is false for a payload that is not
	// UTF-8 or is over dlqwire.MaxEditPayload; Note says why.
	Payload  string
	Editable bool
	Pretty   bool
	Note     string
	// Set and Unset are the header fields' text (on a preview, as the operator gave them).
	Set, Unset string
	// Closed is true on a message page not asked for the editor (?edit=1): it shows a link
	// to it instead, so the page stays as small as its bounded preview and carries no
	// unmasked payload until an operator asks.
	Closed bool
}

// editText returns rec's payload as the editor shows it.
func editText(rec dlq.Record) (text string, editable, pretty bool, note string) {
	switch {
	case len(rec.Payload) > dlqwire.MaxEditPayload:
		return "", false, false, fmt.Sprintf("The payload (%d bytes) is over the %d-byte limit of an edit: only headers can be changed.", len(rec.Payload), dlqwire.MaxEditPayload)
	case !utf8.Valid(rec.Payload):
		return "", false, false, "The payload is binary (not UTF-8): only headers can be changed here."
	}
	text = string(rec.Payload)
	if isJSONType(rec.Properties.ContentType) {
		if p, ok := prettyJSON(text, rec.Properties.ContentType, false); ok {
			return p, true, true, ""
		}
	}
	return text, true, false, ""
}

// newEditForm returns the form editing the first of all (the message an edit changes);
// closed, it holds no payload (see EditForm.Closed).
func newEditForm(rec dlq.Record, all []dlq.Record, closed bool) EditForm {
	first := rec
	if len(all) > 0 {
		first = all[0]
	}
	f := EditForm{ID: first.ID, Position: first.Position, Others: max(len(all)-1, 0), Closed: closed}
	if !closed {
		f.Payload, f.Editable, f.Pretty, f.Note = editText(first)
	}
	return f
}

// normalizeNewlines undoes the CRLF a browser submits a textarea's lines with, unless the
// original payload had CRLF lines itself.
func normalizeNewlines(text string, original []byte) string {
	if bytes.Contains(original, []byte("\r\n")) {
		return text
	}
	return strings.ReplaceAll(text, "\r\n", "\n")
}

// parseSetHeaders reads "name=value" lines.
func parseSetHeaders(text string) (map[string]string, error) {
	set := map[string]string{}
	for n, line := range strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%w: header line %d %q is not name=value", dlq.ErrEditRefused, n+1, line)
		}
		set[strings.TrimSpace(k)] = v
	}
	return set, nil
}

// parseUnsetHeaders reads header names, one a line or comma-separated.
func parseUnsetHeaders(text string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(text, func(r rune) bool { return r == '\n' || r == '\r' || r == ',' }) {
		if k := strings.TrimSpace(f); k != "" && !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// checkEdit is the checks Operator.Edit makes, first of e alone (dlqwire.CheckEdit), then
// against the message: a JSON message's new payload must parse.
func checkEdit(e dlq.Edit, rec dlq.Record) error {
	if err := dlqwire.CheckEdit(e.ID, e.Payload, e.SetHeaders, e.UnsetHeaders); err != nil {
		return err
	}
	if e.Payload != nil && isJSONType(rec.Properties.ContentType) && !json.Valid(e.Payload) {
		var v any
		err := json.Unmarshal(e.Payload, &v)
		return fmt.Errorf("%w: message %q has content type %q and the new payload is not valid JSON: %w", dlq.ErrEditRefused, e.ID, rec.Properties.ContentType, err)
	}
	return nil
}

// HeaderChange is one header an edit sets or removes.
type HeaderChange struct {
	Name string
	// Op is "add", "set" (a new value) or "unset".
	Op       string
	Old, New string
}

// headerChanges lists e's header changes against rec, by name; old values are masked as
// the message page masks them.
func headerChanges(e dlq.Edit, rec dlq.Record) []HeaderChange {
	var out []HeaderChange
	for _, k := range slices.Sorted(maps.Keys(e.SetHeaders)) {
		c := HeaderChange{Name: k, Op: "add", New: mask.Header(k, e.SetHeaders[k])}
		if old, ok := rec.Headers[k]; ok {
			c.Op, c.Old = "set", mask.Header(k, old)
		}
		out = append(out, c)
	}
	for _, k := range e.UnsetHeaders {
		c := HeaderChange{Name: k, Op: "unset"}
		if old, ok := rec.Headers[k]; ok {
			c.Old = mask.Header(k, old)
		}
		out = append(out, c)
	}
	return out
}

// parseEditForm parses a multipart (or urlencoded) edit form of at most formEditBody
// bytes, and checks its CSRF token.
func (s *Server) parseEditForm(w http.ResponseWriter, r *http.Request) error {
	r.Body = http.MaxBytesReader(w, r.Body, formEditBody)
	if err := r.ParseMultipartForm(formEditBody); err != nil && !errors.Is(err, http.ErrNotMultipart) {
		return fmt.Errorf("read the form: %w", err)
	}
	if !s.validCSRF(r.PostFormValue("csrf")) {
		return errCSRF
	}
	return nil
}

// errCSRF means a form lacks the CSRF token.
var errCSRF = errors.New("this form lacks the console's CSRF token: open the page again and submit from there")

func (s *Server) formFail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errCSRF) {
		s.render(w, r, http.StatusForbidden, "error", map[string]any{"Title": "Forbidden", "Status": http.StatusForbidden, "Error": err.Error()})
		return
	}
	s.pageFail(w, r, err)
}

// editPreview shows what the edit form's change would do: the payload's line diff, the
// header changes and, when dlqwire.CheckEdit (or the JSON check) refuses it, why. Nothing
// changes; its Confirm button posts the edit.
func (s *Server) editPreview(w http.ResponseWriter, r *http.Request) {
	if err := s.parseEditForm(w, r); err != nil {
		s.formFail(w, r, err)
		return
	}
	ctx, cancel := s.ctx(r)
	defer cancel()
	queue, id := r.PathValue("queue"), r.PathValue("id")
	all, err := s.inspector(dlq.FromDLQ).Show(ctx, queue, id)
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	rec := all[0]
	form := newEditForm(rec, all, false)
	oldText := form.Payload
	crlf := strings.NewReplacer("\r\n", "\n")
	form.Set, form.Unset = crlf.Replace(r.PostFormValue("set_headers")), crlf.Replace(r.PostFormValue("unset_headers"))
	e := dlq.Edit{ID: id, UnsetHeaders: parseUnsetHeaders(form.Unset)}
	var problem error
	if e.SetHeaders, problem = parseSetHeaders(form.Set); problem == nil && len(e.SetHeaders) == 0 {
		e.SetHeaders = nil
	}
	newText, compacted := oldText, false
	if _, given := r.PostForm["payload"]; given && form.Editable {
		newText = normalizeNewlines(r.PostFormValue("payload"), rec.Payload)
		form.Payload = newText
		if newText != oldText {
			e.Payload = []byte(newText)
			// The editor showed a compact JSON payload indented: published compact again.
			if form.Pretty && json.Valid(e.Payload) {
				var b bytes.Buffer
				if json.Compact(&b, e.Payload) == nil {
					e.Payload, compacted = b.Bytes(), true
				}
			}
		}
	}
	if problem == nil {
		problem = checkEdit(e, rec)
	}
	diff := lineDiff(oldText, newText)
	removed, added := diffStats(diff)
	data := map[string]any{
		"Title": "Edit " + id, "Queue": queue, "ID": id, "Form": form, "Record": dlqview.Of(dlqview.Record(rec)).Record,
		"Diff": diff, "Removed": removed, "Added": added, "PayloadChanged": e.Payload != nil, "Compacted": compacted,
		"Headers": headerChanges(e, rec), "DLQ": topology.DLQ(queue), "Archive": topology.Archive(queue),
		"MaxPayload": dlqwire.MaxEditPayload,
	}
	if rec.CompensationID != "" {
		// Confirm asks once more: the edit redoes the work the compensation undid.
		data["Compensation"] = dlqview.Compensation(dlqview.Of(dlqview.Record(rec)).Record)
	}
	code := http.StatusOK
	if problem != nil {
		code = status(problem)
		data["Problem"] = s.mask(problem.Error())
	} else {
		if e.Payload != nil {
			data["PayloadB64"] = base64.StdEncoding.EncodeToString(e.Payload)
		}
		var set []string
		for _, k := range slices.Sorted(maps.Keys(e.SetHeaders)) {
			set = append(set, k+"="+e.SetHeaders[k])
		}
		data["SetPairs"], data["UnsetNames"] = set, e.UnsetHeaders
	}
	s.render(w, r, code, "edit", data)
}

// editForm runs the edit a preview's Confirm posted: payload_b64 (absent: keep the
// payload), set (name=value, repeated) and unset (repeated).
func (s *Server) editForm(w http.ResponseWriter, r *http.Request) {
	if err := s.parseEditForm(w, r); err != nil {
		s.formFail(w, r, err)
		return
	}
	queue, id := r.PathValue("queue"), r.PathValue("id")
	e := dlq.Edit{ID: id, UnsetHeaders: r.PostForm["unset"]}
	if v, ok := r.PostForm["payload_b64"]; ok && len(v) == 1 {
		p, err := base64.StdEncoding.DecodeString(v[0])
		if err != nil {
			s.pageFail(w, r, fmt.Errorf("payload_b64 is not base64: %w", ErrBadRequest))
			return
		}
		e.Payload = p
	}
	for _, kv := range r.PostForm["set"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			s.pageFail(w, r, fmt.Errorf("set %q is not name=value: %w", kv, ErrBadRequest))
			return
		}
		if e.SetHeaders == nil {
			e.SetHeaders = map[string]string{}
		}
		e.SetHeaders[k] = v
	}
	ctx, cancel := s.actionCtx(r)
	defer cancel()
	res, err := s.operator(r.Context()).Edit(ctx, queue, e, dlq.Options{Compensated: r.PostFormValue("compensated") == "yes"})
	if err != nil {
		s.pageFail(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "edited", map[string]any{"Title": "Edited " + id, "Queue": queue, "Result": res,
		"Actor": identityOf(r.Context()).Actor()})
}

// apiEdit runs POST /api/v1/queues/{queue}/messages/{id}/edit with an EditRequest body and
// the CSRF token in the X-CSRF-Token header.
func (s *Server) apiEdit(w http.ResponseWriter, r *http.Request) {
	if !s.validCSRF(r.Header.Get(CSRFHeader)) {
		s.writeJSON(w, http.StatusForbidden, apiError{Error: "missing or wrong " + CSRFHeader + " header (GET /api/v1/csrf gives the token)", Status: http.StatusForbidden})
		return
	}
	var req EditRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, apiEditBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		code := status(err)
		if code != http.StatusRequestEntityTooLarge {
			code = http.StatusBadRequest
		}
		s.writeJSON(w, code, apiError{Error: "bad JSON body: " + err.Error(), Status: code})
		return
	}
	e := dlq.Edit{ID: r.PathValue("id"), SetHeaders: req.SetHeaders, UnsetHeaders: req.UnsetHeaders}
	if req.Payload != nil {
		e.Payload = []byte(*req.Payload)
	}
	ctx, cancel := s.actionCtx(r)
	defer cancel()
	res, err := s.operator(r.Context()).Edit(ctx, r.PathValue("queue"), e, dlq.Options{Compensated: req.Compensated})
	if err != nil {
		s.apiFail(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, EditResponse{EditResult: res, Actor: identityOf(r.Context()).Actor()})
}
