package console_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"html"
	"mime/multipart"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/dlqwire"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/topology"
)

// jsonMD is the metadata of a JSON message.
func jsonMD(extra map[string]string) map[string]string {
	md := map[string]string{amqp.MetadataContentType: "application/json"}
	for k, v := range extra {
		md[k] = v
	}
	return md
}

// auditEvents reads fx's audit trail.
func auditEvents(t *testing.T, fx *fixture) []dlq.AuditEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	events, err := dlq.ReadAudit(ctx, fx.rabbit.Conn, dlq.AuditQuery{Exchange: fx.audit, Queue: fx.queue})
	require.NoError(t, err)
	return events
}

// editAPI posts body to the edit API of id as the token's holder, with the CSRF token.
func editAPI(t *testing.T, fx *fixture, token, id, body string) (int, string) {
	t.Helper()
	h := bearer(token)
	h.Set(console.CSRFHeader, fx.console.CSRFToken())
	h.Set("Content-Type", "application/json")
	return fx.do(t, http.MethodPost, "/api/v1/queues/"+fx.queue+"/messages/"+url.PathEscape(id)+"/edit", body, h)
}

// TestEditAPI: POST /api/v1/queues/{queue}/messages/{id}/edit refuses bad input (invalid
// JSON, an oversized payload, a reserved header, nothing to change: 400; a body over the
// limit: 413), a missing id (404), a request without the CSRF token or from a read-only
// token (403), each leaving the DLQ as it was; a valid edit publishes the corrected copy to
// Q, moves the original to Q.dlq.archive, and is in the audit trail as console:alice, on
// the audit page and in its API.
func TestEditAPI(t *testing.T) {
	fx := newFixture(t, func(c *console.Config) { c.Token = "alice:s1"; c.ReadToken = "carol:s2" })
	q, dlqName, archive := fx.queue, topology.DLQ(fx.queue), topology.Archive(fx.queue)
	fx.rabbit.DeleteQueues(archive)
	fx.deadLetter(t, "e-1", `{"id":"e-1","amount":-5}`, typedError{"invalid_amount", "amount must be positive"}, jsonMD(map[string]string{"tenant": "acme", "x-note": "check"}))
	fx.deadLetter(t, "e-2", `{"id":"e-2"}`, gatewayDown(), jsonMD(nil))

	quote := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	cases := []struct {
		name     string
		token    string
		id, body string
		csrf     bool
		wantCode int
		want     string
	}{
		{"invalid JSON for a JSON message", "s1", "e-1", `{"payload":"{\"id\":"}`, true, http.StatusBadRequest, "not valid JSON"},
		{"payload over the limit", "s1", "e-1", `{"payload":` + quote(strings.Repeat("a", dlqwire.MaxEditPayload+1)) + `}`, true, http.StatusBadRequest, "over the 1048576-byte limit"},
		{"body over the limit", "s1", "e-1", `{"payload":` + quote(strings.Repeat("a", 2*dlqwire.MaxEditPayload)) + `}`, true, http.StatusRequestEntityTooLarge, "too large"},
		{"reserved header", "s1", "e-1", `{"set_headers":{"x-retry-count":"0"}}`, true, http.StatusBadRequest, "cannot be edited"},
		{"header value over the limit", "s1", "e-1", `{"set_headers":{"tenant":` + quote(strings.Repeat("v", dlqwire.MaxEditHeaderValue+1)) + `}}`, true, http.StatusBadRequest, "over the"},
		{"nothing to change", "s1", "e-1", `{}`, true, http.StatusBadRequest, "nothing to change"},
		{"unknown field", "s1", "e-1", `{"paylod":"x"}`, true, http.StatusBadRequest, "unknown field"},
		{"missing id", "s1", "no-such-id", `{"payload":"{}"}`, true, http.StatusNotFound, "no-such-id"},
		{"without the CSRF header", "s1", "e-1", `{"payload":"{}"}`, false, http.StatusForbidden, console.CSRFHeader},
		{"read-only token", "s2", "e-1", `{"payload":"{}"}`, true, http.StatusForbidden, "this token is read-only"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := bearer(tc.token)
			if tc.csrf {
				h.Set(console.CSRFHeader, fx.console.CSRFToken())
			}
			code, body := fx.do(t, http.MethodPost, "/api/v1/queues/"+q+"/messages/"+tc.id+"/edit", tc.body, h)
			assert.Equal(t, tc.wantCode, code, body)
			assert.Contains(t, body, tc.want)
			assert.Equal(t, 2, fx.rabbit.Count(dlqName), "a refused edit changes nothing")
			assert.Equal(t, 0, fx.rabbit.Count(q))
		})
	}
	assert.LessOrEqual(t, fx.rabbit.Count(archive), 0, "nothing archived")

	original, ok := peekBody(t, fx, "e-1")
	require.True(t, ok)
	sum := sha256.Sum256(original)
	code, body := editAPI(t, fx, "s1", "e-1", `{"payload":"{\"id\":\"e-1\",\"amount\":5}","set_headers":{"tenant":"globex"},"unset_headers":["x-note"]}`)
	require.Equal(t, http.StatusOK, code, body)
	var res console.EditResponse
	require.NoError(t, json.Unmarshal([]byte(body), &res))
	assert.Equal(t, "console:alice", res.Actor)
	assert.Equal(t, "e-1", res.ID)
	assert.Equal(t, archive, res.Archive)
	assert.Equal(t, q, res.Destination)
	assert.Equal(t, 1, res.Moved)
	assert.Equal(t, hex.EncodeToString(sum[:]), res.OriginalSHA256)

	assert.Equal(t, 1, fx.rabbit.Count(dlqName), "e-2 stays")
	require.Equal(t, 1, fx.rabbit.Count(q))
	copyMsg, ok := fx.rabbit.Get(q)
	require.True(t, ok)
	assert.JSONEq(t, `{"id":"e-1","amount":5}`, string(copyMsg.Body))
	assert.Equal(t, "globex", copyMsg.Headers["tenant"])
	assert.NotContains(t, copyMsg.Headers, "x-note")
	assert.Equal(t, "console:alice", copyMsg.Headers[headers.EditedBy])
	require.Equal(t, 1, fx.rabbit.Count(archive))
	orig, ok := fx.rabbit.Get(archive)
	require.True(t, ok)
	assert.Equal(t, original, orig.Body, "the original is archived unchanged")

	var edit *dlq.AuditEvent
	for _, ev := range auditEvents(t, fx) {
		if ev.Action == "edit" && ev.Result == "ok" {
			edit = &ev
		}
	}
	require.NotNil(t, edit, "the edit is in the audit trail")
	assert.Equal(t, "console:alice", edit.Actor)
	assert.Equal(t, []string{"e-1"}, edit.IDs)

	t.Run("audit page", func(t *testing.T) {
		code, page := fx.do(t, http.MethodGet, "/audit?queue="+url.QueryEscape(q)+"&since=1h", "", bearer("s2"))
		require.Equal(t, http.StatusOK, code, page)
		assert.Contains(t, page, `data-event="`+edit.ID+`"`)
		assert.Contains(t, page, "<code>console:alice</code>")
		assert.Contains(t, page, "<td>edit</td>")
		assert.Contains(t, page, `href="/audit" id="nav-audit"`, "the layout links the audit page")
		_, other := fx.do(t, http.MethodGet, "/audit?queue=no.such.queue", "", bearer("s2"))
		assert.NotContains(t, other, edit.ID)
		assert.Contains(t, other, `id="no-events"`)
	})
	t.Run("audit API", func(t *testing.T) {
		code, body := fx.do(t, http.MethodGet, "/api/v1/audit?queue="+url.QueryEscape(q)+"&since=24h", "", bearer("s2"))
		require.Equal(t, http.StatusOK, code, body)
		var out struct {
			Exchange string           `json:"exchange"`
			Events   []dlq.AuditEvent `json:"events"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &out))
		assert.Equal(t, fx.audit, out.Exchange)
		require.NotEmpty(t, out.Events)
		assert.Equal(t, edit.ID, out.Events[0].ID, "newest first")
		assert.Equal(t, "console:alice", out.Events[0].Actor)
		assert.Equal(t, "edit", out.Events[0].Action)
		code, _ = fx.do(t, http.MethodGet, "/api/v1/audit?since=soon", "", bearer("s2"))
		assert.Equal(t, http.StatusBadRequest, code)
	})
}

// peekBody returns the payload of message id of fx's DLQ, through the console's download.
func peekBody(t *testing.T, fx *fixture, id string) ([]byte, bool) {
	t.Helper()
	code, body := fx.do(t, http.MethodGet, "/queues/"+fx.queue+"/messages/"+id+"/payload", "", bearer("s1"))
	return []byte(body), code == http.StatusOK
}

// multipartBody encodes fields as the edit forms post them.
func multipartBody(t *testing.T, fields [][2]string) (string, http.Header) {
	t.Helper()
	var b strings.Builder
	mw := multipart.NewWriter(&b)
	for _, f := range fields {
		require.NoError(t, mw.WriteField(f[0], f[1]))
	}
	require.NoError(t, mw.Close())
	return b.String(), http.Header{"Content-Type": {mw.FormDataContentType()}}
}

var hiddenRE = regexp.MustCompile(`<input type="hidden" name="(payload_b64|set|unset|csrf)" value="([^"]*)">`)

// TestEditForm: the message page's edit form (JSON indented in its editor; disabled, with
// the reason, for a read-only token), its preview (a line diff, escaped; the header
// changes; refusals with nothing changed) and its Confirm, which edits the message.
func TestEditForm(t *testing.T) {
	fx := newFixture(t, func(c *console.Config) { c.Token = "alice:s1"; c.ReadToken = "carol:s2" })
	q, dlqName, archive := fx.queue, topology.DLQ(fx.queue), topology.Archive(fx.queue)
	fx.rabbit.DeleteQueues(archive)
	fx.deadLetter(t, "f-1", `{"id":"f-1","amount":-5,"currency":"EUR"}`, typedError{"invalid_amount", "amount must be positive"}, jsonMD(map[string]string{"tenant": "acme"}))
	csrf := fx.console.CSRFToken()
	preview := func(token string, fields ...[2]string) (int, string) {
		body, h := multipartBody(t, fields)
		for k, v := range bearer(token) {
			h[k] = v
		}
		return fx.do(t, http.MethodPost, "/queues/"+q+"/messages/f-1/edit/preview", body, h)
	}

	t.Run("message page", func(t *testing.T) {
		code, page := fx.do(t, http.MethodGet, "/queues/"+q+"/messages/f-1", "", bearer("s1"))
		require.Equal(t, http.StatusOK, code, page)
		assert.NotContains(t, page, `id="edit-payload"`, "the editor and its unmasked payload load only when asked for")
		assert.Contains(t, page, `href="?edit=1#edit" id="edit-open"`)
		code, page = fx.do(t, http.MethodGet, "/queues/"+q+"/messages/f-1?edit=1", "", bearer("s1"))
		require.Equal(t, http.StatusOK, code, page)
		assert.Contains(t, page, `id="edit-form"`)
		assert.Contains(t, page, "<textarea name=\"payload\" id=\"edit-payload\" rows=\"14\" spellcheck=\"false\">\n{\n  &#34;id&#34;: &#34;f-1&#34;,\n  &#34;amount&#34;: -5,", "JSON is indented for editing")
		code, page = fx.do(t, http.MethodGet, "/queues/"+q+"/messages/f-1?edit=1", "", bearer("s2"))
		require.Equal(t, http.StatusOK, code, page)
		assert.NotContains(t, page, `id="edit-form"`)
		assert.NotContains(t, page, `id="edit-payload"`, "a read-only token never gets the editor's unmasked payload")
		assert.Contains(t, page, `<button type="button" id="edit-preview" disabled title="`+html.EscapeString(console.ReadOnlyMessage)+`">Edit and retry</button>`)
	})

	refusals := []struct {
		name     string
		token    string
		fields   [][2]string
		wantCode int
		want     string
	}{
		{"invalid JSON", "s1", [][2]string{{"csrf", csrf}, {"payload", `{"id": "f-1", "amount": `}}, http.StatusBadRequest, "not valid JSON"},
		{"oversized payload", "s1", [][2]string{{"csrf", csrf}, {"payload", `"` + strings.Repeat("a", dlqwire.MaxEditPayload) + `"`}}, http.StatusBadRequest, "over the 1048576-byte limit"},
		{"body over the form's limit", "s1", [][2]string{{"csrf", csrf}, {"payload", strings.Repeat("a", 2*dlqwire.MaxEditPayload)}}, http.StatusRequestEntityTooLarge, "too large"},
		{"nothing changed", "s1", [][2]string{{"csrf", csrf}, {"payload", "{\r\n  \"id\": \"f-1\",\r\n  \"amount\": -5,\r\n  \"currency\": \"EUR\"\r\n}"}}, http.StatusBadRequest, "nothing to change"},
		{"a bad header line", "s1", [][2]string{{"csrf", csrf}, {"set_headers", "tenant"}}, http.StatusBadRequest, "is not name=value"},
		{"a reserved header", "s1", [][2]string{{"csrf", csrf}, {"unset_headers", "x-error-type"}}, http.StatusBadRequest, "cannot be edited"},
		{"no CSRF token", "s1", [][2]string{{"payload", `{}`}}, http.StatusForbidden, "CSRF"},
		{"read-only token", "s2", [][2]string{{"csrf", csrf}, {"payload", `{}`}}, http.StatusForbidden, "read-only"},
	}
	for _, tc := range refusals {
		t.Run("preview refused: "+tc.name, func(t *testing.T) {
			code, page := preview(tc.token, tc.fields...)
			assert.Equal(t, tc.wantCode, code, page)
			assert.Contains(t, page, tc.want)
			assert.NotContains(t, page, `id="edit-confirm"`)
			assert.Equal(t, 1, fx.rabbit.Count(dlqName))
		})
	}
	t.Run("preview of a missing id", func(t *testing.T) {
		body, h := multipartBody(t, [][2]string{{"csrf", csrf}, {"payload", "{}"}})
		h.Set("Authorization", "Bearer s1")
		code, page := fx.do(t, http.MethodPost, "/queues/"+q+"/messages/nope/edit/preview", body, h)
		assert.Equal(t, http.StatusNotFound, code, page)
	})
	t.Run("confirm of a missing id", func(t *testing.T) {
		body, h := multipartBody(t, [][2]string{{"csrf", csrf}, {"payload_b64", "e30="}})
		h.Set("Authorization", "Bearer s1")
		code, page := fx.do(t, http.MethodPost, "/queues/"+q+"/messages/nope/edit", body, h)
		assert.Equal(t, http.StatusNotFound, code, page)
	})

	// A browser posts the textarea with CRLF lines.
	edited := "{\r\n  \"id\": \"f-1\",\r\n  \"amount\": 5,\r\n  \"currency\": \"EUR\",\r\n  \"note\": \"" + strings.ReplaceAll(hostile, `"`, `'`) + "\"\r\n}"
	code, page := preview("s1", [2]string{"csrf", csrf}, [2]string{"payload", edited}, [2]string{"set_headers", "tenant=globex\r\nx-fixed=yes"})
	require.Equal(t, http.StatusOK, code, page)
	assert.Contains(t, page, `<tr class="del"><td class="ln">3</td><td class="ln"></td><td class="sign">-</td><td class="text"><pre>  &#34;amount&#34;: -5,</pre></td></tr>`)
	assert.Contains(t, page, `<tr class="ins"><td class="ln"></td><td class="ln">3</td><td class="sign">&#43;</td><td class="text"><pre>  &#34;amount&#34;: 5,</pre></td></tr>`)
	assert.Contains(t, page, "−2</span> <span class=\"ins\">+3</span> line(s)")
	assert.Contains(t, page, "<tr><th>tenant</th><td>set</td><td>acme</td><td>globex</td></tr>")
	assert.Contains(t, page, "<tr><th>x-fixed</th><td>add</td>")
	assert.NotContains(t, page, "<script>document", "the diff is escaped")
	assert.NotContains(t, page, "<img src=x")
	assert.Equal(t, 1, fx.rabbit.Count(dlqName), "a preview changes nothing")

	confirm := [][2]string{}
	form := page[strings.Index(page, `id="edit-confirm-form"`):]
	form = form[:strings.Index(form, "</form>")]
	for _, m := range hiddenRE.FindAllStringSubmatch(form, -1) {
		confirm = append(confirm, [2]string{m[1], html.UnescapeString(m[2])})
	}
	require.Len(t, confirm, 4, "csrf, payload_b64 and two headers")
	body, h := multipartBody(t, confirm)
	h.Set("Authorization", "Bearer s1")
	code, page = fx.do(t, http.MethodPost, "/queues/"+q+"/messages/f-1/edit", body, h)
	require.Equal(t, http.StatusOK, code, page)
	assert.Contains(t, page, `<code id="edited-destination">`+q+`</code>`)
	assert.Contains(t, page, `<code id="edited-archive">`+archive+`</code>`)
	assert.Contains(t, page, `<code id="actor">console:alice</code>`)
	assert.Regexp(t, `<code id="edited-sha">[0-9a-f]{64}</code>`, page)

	require.Equal(t, 1, fx.rabbit.Count(q))
	copyMsg, ok := fx.rabbit.Get(q)
	require.True(t, ok)
	assert.Equal(t, `{"id":"f-1","amount":5,"currency":"EUR","note":"`+strings.ReplaceAll(hostile, `"`, `'`)+`"}`, string(copyMsg.Body), "published compact, as the original was")
	assert.Equal(t, "globex", copyMsg.Headers["tenant"])
	assert.Equal(t, "yes", copyMsg.Headers["x-fixed"])
	assert.Equal(t, 0, fx.rabbit.Count(dlqName))
	assert.Equal(t, 1, fx.rabbit.Count(archive))
	events := auditEvents(t, fx)
	require.NotEmpty(t, events)
	last := events[len(events)-1]
	assert.Equal(t, "edit", last.Action)
	assert.Equal(t, "console:alice", last.Actor)
	assert.Equal(t, "ok", last.Result)
}
