package console_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/topology"
)

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }

// groupsOf returns the failure groups the API reports for fx's queue, asked with header
// (an access token) if given.
func groupsOf(t *testing.T, fx *fixture, header ...http.Header) []dlq.Group {
	t.Helper()
	var h http.Header
	if len(header) > 0 {
		h = header[0]
	}
	code, body := fx.do(t, http.MethodGet, "/api/v1/queues/"+fx.queue+"/groups", "", h)
	require.Equal(t, http.StatusOK, code, body)
	var out struct {
		Groups []struct {
			ID        string `json:"id"`
			ErrorType string `json:"error_type"`
			Count     int    `json:"count"`
		} `json:"groups"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &out))
	var gs []dlq.Group
	for _, g := range out.Groups {
		gs = append(gs, dlq.Group{ID: g.ID, ErrorType: g.ErrorType, Count: g.Count})
	}
	return gs
}

func groupOf(t *testing.T, fx *fixture, errorType string, header ...http.Header) string {
	t.Helper()
	for _, g := range groupsOf(t, fx, header...) {
		if g.ErrorType == errorType {
			return g.ID
		}
	}
	t.Fatalf("no group of error type %s", errorType)
	return ""
}

func TestReads(t *testing.T) {
	fx := newFixture(t, nil)
	fx.deadLetter(t, "m-1", `{"id":"m-1"}`, gatewayDown(), nil)
	fx.deadLetter(t, "m-2", `{"id":"m-2"}`, gatewayDown(), nil)
	fx.deadLetter(t, "evil", hostile, typedError{"evil_error", "bad input " + hostile}, map[string]string{"x-evil": hostile})
	const oddID = "odd/id?x=1 #y"
	fx.deadLetter(t, oddID, `{}`, typedError{"odd", "odd id"}, nil)
	gateway := groupOf(t, fx, "gateway_down")
	odd := groupOf(t, fx, "odd")
	q := fx.queue

	cases := []struct {
		name     string
		path     string
		wantCode int
		want     []string
		notWant  []string
	}{
		{name: "overview", path: "/", wantCode: 200, want: []string{`href="/queues/` + q + `"`, `<td data-field="dlq" class="bad">4</td>`, "sluice.unrouted", "/static/console.js", "not.sluice.queue"}},
		{name: "overview API", path: "/api/v1/queues", wantCode: 200, want: []string{`"queue": "` + q + `"`, `"dlq": 4`, `"archive": 0`, `"unacked": null`, `"skipped": [`}},
		{name: "queue page lists its groups", path: "/queues/" + q, wantCode: 200, want: []string{gateway, "gateway: 503 service unavailable", "evil_error", "/queues/" + q + "/confirm?op=replay&amp;group=" + gateway}, notWant: []string{"<script>document"}},
		{name: "a group opens its messages", path: "/queues/" + q + "?group=" + gateway, wantCode: 200, want: []string{`href="/queues/` + q + `/messages/m-1"`, `/messages/m-2"`}, notWant: []string{"/messages/evil\""}},
		{name: "groups API", path: "/api/v1/queues/" + q + "/groups", wantCode: 200, want: []string{`"id": "` + gateway + `"`, `"count": 2`, `"first_failed_at"`}},
		{name: "messages API of a group", path: "/api/v1/queues/" + q + "/messages?group=" + gateway, wantCode: 200, want: []string{`"id": "m-1"`, `"id": "m-2"`}, notWant: []string{`"id": "evil"`}},
		{name: "message page", path: "/queues/" + q + "/messages/m-1", wantCode: 200, want: []string{"gateway: 503 service unavailable", "{\n  &#34;id&#34;: &#34;m-1&#34;\n}</pre>", "Jaeger is not configured", "worker-1", "x-retry-count",
			"<tr><th>Reason</th><td>no_delay</td></tr>"}},
		{name: "hostile message is text", path: "/queues/" + q + "/messages/evil", wantCode: 200,
			want:    []string{"&lt;script&gt;document.title=&#34;pwned&#34;&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;", "x-evil"},
			notWant: []string{"<script>document", "<img src=x"}},
		{name: "message API", path: "/api/v1/queues/" + q + "/messages/m-2", wantCode: 200, want: []string{`"id": "m-2"`, `"error_type": "gateway_down"`, `"reason": "no_delay"`, `"payload": "{\"id\":\"m-2\"}"`}},
		{name: "an odd id is linked escaped", path: "/queues/" + q + "?group=" + odd, wantCode: 200, want: []string{`href="/queues/` + q + `/messages/odd%2Fid%3Fx=1%20%23y"`}},
		{name: "an odd id opens", path: "/queues/" + q + "/messages/" + url.PathEscape(oddID), wantCode: 200, want: []string{"odd/id?x=1 #y"}},
		{name: "unknown queue page", path: "/queues/no.such.queue", wantCode: 404, want: []string{"not found"}},
		{name: "unknown queue API", path: "/api/v1/queues/no.such.queue/groups", wantCode: 404, want: []string{`"status": 404`}},
		{name: "unknown message page", path: "/queues/" + q + "/messages/nope", wantCode: 404, want: []string{"message not found"}},
		{name: "unknown message API", path: "/api/v1/queues/" + q + "/messages/nope", wantCode: 404, want: []string{`"status": 404`}},
		{name: "message of an unknown queue", path: "/api/v1/queues/no.such.queue/messages/m-1", wantCode: 404},
		{name: "unknown group", path: "/queues/" + q + "?group=nogroup", wantCode: 404},
		{name: "hostile queue name is text", path: "/queues/" + url.PathEscape(hostile), wantCode: 404, notWant: []string{"<script>document"}},
		{name: "confirm without a target", path: "/queues/" + q + "/confirm?op=replay", wantCode: 400},
		{name: "confirm of an unknown op", path: "/queues/" + q + "/confirm?op=explode&group=" + gateway, wantCode: 400},
		{name: "confirm of an unknown group", path: "/queues/" + q + "/confirm?op=purge&group=nogroup", wantCode: 404},
		{name: "confirm of a group", path: "/queues/" + q + "/confirm?op=replay&group=" + gateway, wantCode: 200,
			want: []string{"Send 2 message(s) from <code>" + topology.DLQ(q) + "</code> back to", `name="csrf" value="` + fx.console.CSRFToken() + `"`, `name="group" value="` + gateway + `"`}},
		{name: "static script", path: "/static/console.js", wantCode: 200, want: []string{"fetch(api"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := fx.get(t, tc.path)
			assert.Equal(t, tc.wantCode, code, body)
			for _, w := range tc.want {
				assert.Contains(t, body, w)
			}
			for _, nw := range tc.notWant {
				assert.NotContains(t, body, nw)
			}
			assert.NotContains(t, body, "guest:guest", "the AMQP password never appears")
		})
	}
	// Nothing was consumed by the reads.
	assert.Equal(t, 4, fx.rabbit.Count(topology.DLQ(q)))
}

func TestActions(t *testing.T) {
	fx := newFixture(t, nil)
	q, dlqName, archive := fx.queue, topology.DLQ(fx.queue), topology.Archive(fx.queue)
	for _, id := range []string{"a-1", "a-2", "a-3"} {
		fx.deadLetter(t, id, `{"id":"`+id+`"}`, gatewayDown(), nil)
	}
	fx.deadLetter(t, "b-1", `{}`, typedError{"invalid_amount", "amount must be positive"}, nil)
	fx.deadLetter(t, "c-1", `{}`, typedError{"timeout", "deadline"}, nil)
	gateway := groupOf(t, fx, "gateway_down")
	token := fx.console.CSRFToken()
	// A token that differs from the real one in its first character, whatever that is.
	wrong := "0" + token[1:]
	if token[0] == '0' {
		wrong = "1" + token[1:]
	}
	form := func(v url.Values) (int, string) {
		return fx.do(t, http.MethodPost, "/queues/"+q+"/actions", v.Encode(), http.Header{"Content-Type": {"application/x-www-form-urlencoded"}})
	}
	api := func(op, body, csrf string, extra ...string) (int, string) {
		h := http.Header{"Content-Type": {"application/json"}}
		if csrf != "" {
			h.Set(console.CSRFHeader, csrf)
		}
		for i := 0; i+1 < len(extra); i += 2 {
			h.Set(extra[i], extra[i+1])
		}
		return fx.do(t, http.MethodPost, "/api/v1/queues/"+q+"/"+op, body, h)
	}

	t.Run("refused", func(t *testing.T) {
		cases := []struct {
			name string
			run  func() (int, string)
			want int
		}{
			{"form replay without the CSRF token", func() (int, string) {
				return form(url.Values{"op": {"replay"}, "group": {gateway}})
			}, http.StatusForbidden},
			{"form replay with a wrong token", func() (int, string) {
				return form(url.Values{"op": {"replay"}, "group": {gateway}, "csrf": {wrong}})
			}, http.StatusForbidden},
			{"API replay without the CSRF header", func() (int, string) { return api("replay", `{"group":"`+gateway+`"}`, "") }, http.StatusForbidden},
			{"API replay from another site", func() (int, string) {
				return api("replay", `{"group":"`+gateway+`"}`, token, "Sec-Fetch-Site", "cross-site")
			}, http.StatusForbidden},
			{"API with ids and a group", func() (int, string) { return api("replay", `{"ids":["a-1"],"group":"`+gateway+`"}`, token) }, http.StatusBadRequest},
			{"API without a selector", func() (int, string) { return api("purge", `{}`, token) }, http.StatusBadRequest},
			{"API with bad JSON", func() (int, string) { return api("purge", `{"ids":`, token) }, http.StatusBadRequest},
			{"API unknown op", func() (int, string) { return api("explode", `{"ids":["a-1"]}`, token) }, http.StatusNotFound},
			{"API unknown id", func() (int, string) { return api("replay", `{"ids":["nope"]}`, token) }, http.StatusNotFound},
			{"API unknown group", func() (int, string) { return api("archive", `{"group":"nogroup"}`, token) }, http.StatusNotFound},
			{"API unknown queue", func() (int, string) {
				return fx.do(t, http.MethodPost, "/api/v1/queues/no.such.queue/replay", `{"ids":["a-1"]}`, http.Header{console.CSRFHeader: {token}})
			}, http.StatusNotFound},
			{"form unknown op", func() (int, string) { return form(url.Values{"op": {"explode"}, "id": {"a-1"}, "csrf": {token}}) }, http.StatusBadRequest},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				code, body := tc.run()
				assert.Equal(t, tc.want, code, body)
			})
		}
		assert.Equal(t, 5, fx.rabbit.Count(dlqName), "a refused action moves nothing")
		assert.Equal(t, 0, fx.rabbit.Count(q))
	})

	t.Run("form replay of a group", func(t *testing.T) {
		code, body := form(url.Values{"op": {"replay"}, "group": {gateway}, "csrf": {token}})
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, "Replayed 3 of 3 selected message(s)")
		assert.Equal(t, 3, fx.rabbit.Count(q))
		assert.Equal(t, 2, fx.rabbit.Count(dlqName))
	})
	t.Run("API archive of a message", func(t *testing.T) {
		code, body := api("archive", `{"ids":["b-1"]}`, token)
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `"moved": 1`)
		assert.Equal(t, 1, fx.rabbit.Count(archive))
		assert.Equal(t, 1, fx.rabbit.Count(dlqName))
		_, ov := fx.get(t, "/api/v1/queues")
		assert.Contains(t, ov, `"archive": 1`)
	})
	t.Run("form purge of a message", func(t *testing.T) {
		code, body := form(url.Values{"op": {"purge"}, "id": {"c-1"}, "csrf": {token}})
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, "Purged 1 of 1")
		assert.Equal(t, 0, fx.rabbit.Count(dlqName))
		assert.Equal(t, 3, fx.rabbit.Count(q), "purge leaves the queue alone")
	})
}

func TestAccessToken(t *testing.T) {
	fx := newFixture(t, func(c *console.Config) { c.Token = "s3cret-token" })
	cases := []struct {
		name     string
		path     string
		header   http.Header
		wantCode int
	}{
		{"no token", "/", nil, http.StatusUnauthorized},
		{"no token, API", "/api/v1/queues", nil, http.StatusUnauthorized},
		{"wrong bearer", "/", http.Header{"Authorization": {"Bearer nope"}}, http.StatusUnauthorized},
		{"bearer", "/api/v1/queues", http.Header{"Authorization": {"Bearer s3cret-token"}}, http.StatusOK},
		{"query token sets a cookie and drops itself", "/?token=s3cret-token", nil, http.StatusSeeOther},
		{"cookie", "/", http.Header{"Cookie": {"sluice_console_token=s3cret-token"}}, http.StatusOK},
		{"wrong cookie", "/", http.Header{"Cookie": {"sluice_console_token=x"}}, http.StatusUnauthorized},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := fx.do(t, http.MethodGet, tc.path, "", tc.header)
			assert.Equal(t, tc.wantCode, code, body)
			assert.NotContains(t, body, "s3cret-token")
		})
	}
}

func TestNewNeedsAConnection(t *testing.T) {
	_, err := console.New(console.Config{})
	require.ErrorIs(t, err, console.ErrNoConnection)
}
