package console_test

import (
	"html"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/internal/topology"
)

func bearer(token string) http.Header { return http.Header{"Authorization": {"Bearer " + token}} }

// TestRoles: operator and read-only tokens, bare and named, as a bearer token, a cookie
// or ?token=, on a page, a GET of the API and a POST of an action.
func TestRoles(t *testing.T) {
	fx := newFixture(t, func(c *console.Config) {
		c.Token = "op-secret, alice:s1"
		c.ReadToken = "read-secret,carol:s2"
	})
	fx.deadLetter(t, "r-1", `{}`, gatewayDown(), nil)
	q := fx.queue
	gateway := groupOf(t, fx, "gateway_down", bearer("op-secret"))
	csrf := fx.console.CSRFToken()
	// An action on an id that is not there: an operator gets past access control (404),
	// and nothing moves whoever asks.
	apiPost := func(h http.Header) (int, string) {
		h.Set(console.CSRFHeader, csrf)
		h.Set("Content-Type", "application/json")
		return fx.do(t, http.MethodPost, "/api/v1/queues/"+q+"/replay", `{"ids":["no-such-id"]}`, h)
	}
	formPost := func(h http.Header) (int, string) {
		h.Set("Content-Type", "application/x-www-form-urlencoded")
		v := url.Values{"op": {"purge"}, "id": {"no-such-id"}, "csrf": {csrf}}
		return fx.do(t, http.MethodPost, "/queues/"+q+"/actions", v.Encode(), h)
	}
	get := func(path string) func(http.Header) (int, string) {
		return func(h http.Header) (int, string) { return fx.do(t, http.MethodGet, path, "", h) }
	}
	readOnly := html.EscapeString(console.ReadOnlyMessage)

	cases := []struct {
		name     string
		header   http.Header
		run      func(http.Header) (int, string)
		wantCode int
		want     []string
		notWant  []string
	}{
		{"operator: page", bearer("op-secret"), get("/queues/" + q), http.StatusOK,
			[]string{"signed in as <strong>operator</strong> (operator)", "/queues/" + q + "/confirm?op=purge&amp;group=" + gateway}, []string{"No access control", "op-disabled"}},
		{"operator: API", bearer("op-secret"), get("/api/v1/queues"), http.StatusOK, []string{`"queue": "` + q + `"`}, nil},
		{"operator: POST API", bearer("op-secret"), apiPost, http.StatusNotFound, []string{"no-such-id"}, nil},
		{"operator: POST form", bearer("op-secret"), formPost, http.StatusNotFound, nil, nil},
		{"named operator: page", bearer("s1"), get("/"), http.StatusOK, []string{"signed in as <strong>alice</strong> (operator)"}, nil},
		{"named operator: POST API", bearer("s1"), apiPost, http.StatusNotFound, nil, nil},
		{"named operator: confirm page", bearer("s1"), get("/queues/" + q + "/confirm?op=replay&group=" + gateway), http.StatusOK,
			[]string{`name="csrf" value="` + csrf + `"`, `<button type="submit" id="confirm"`}, nil},
		{"reader: page", bearer("read-secret"), get("/queues/" + q), http.StatusOK,
			[]string{"signed in as <strong>reader</strong> (read-only)", "op-disabled", readOnly, gateway}, []string{"/confirm?op="}},
		{"reader: message page", bearer("read-secret"), get("/queues/" + q + "/messages/r-1"), http.StatusOK,
			[]string{"op-disabled", readOnly}, []string{"/confirm?op="}},
		{"reader: confirm page offers no action", bearer("read-secret"), get("/queues/" + q + "/confirm?op=replay&group=" + gateway), http.StatusOK,
			[]string{readOnly, "disabled"}, []string{`name="csrf"`, `method="post"`}},
		{"reader: API", bearer("read-secret"), get("/api/v1/queues"), http.StatusOK, []string{`"queue": "` + q + `"`}, nil},
		{"reader: messages API", bearer("read-secret"), get("/api/v1/queues/" + q + "/messages?group=" + gateway), http.StatusOK, []string{`"id": "r-1"`}, nil},
		{"reader: POST API is refused", bearer("read-secret"), apiPost, http.StatusForbidden,
			[]string{`"status": 403`, "this token is read-only", "SLUICE_CONSOLE_TOKEN", "operator token"}, nil},
		{"reader: POST form is refused", bearer("read-secret"), formPost, http.StatusForbidden, []string{readOnly}, nil},
		{"named reader: page", bearer("s2"), get("/"), http.StatusOK, []string{"signed in as <strong>carol</strong> (read-only)"}, nil},
		{"named reader: POST API is refused", bearer("s2"), apiPost, http.StatusForbidden, []string{"this token is read-only"}, nil},
		{"named reader: any other POST is refused", bearer("s2"), func(h http.Header) (int, string) {
			return fx.do(t, http.MethodPost, "/", "", h)
		}, http.StatusForbidden, []string{readOnly}, nil},
		{"reader cookie", http.Header{"Cookie": {"sluice_console_token=s2"}}, get("/"), http.StatusOK, []string{"signed in as <strong>carol</strong> (read-only)"}, nil},
		{"reader cookie: POST API is refused", http.Header{"Cookie": {"sluice_console_token=s2"}}, apiPost, http.StatusForbidden, []string{"this token is read-only"}, nil},
		{"operator cookie", http.Header{"Cookie": {"sluice_console_token=s1"}}, get("/"), http.StatusOK, []string{"signed in as <strong>alice</strong> (operator)"}, nil},
		{"reader ?token= sets the cookie", http.Header{}, get("/?token=s2"), http.StatusSeeOther, nil, nil},
		{"operator ?token= sets the cookie", http.Header{}, get("/?token=s1"), http.StatusSeeOther, nil, nil},
		{"wrong token: page", bearer("nope"), get("/"), http.StatusUnauthorized, []string{"SLUICE_CONSOLE_READ_TOKEN"}, nil},
		{"wrong token: API", bearer("nope"), get("/api/v1/queues"), http.StatusUnauthorized, nil, nil},
		{"wrong token: POST API", bearer("nope"), apiPost, http.StatusUnauthorized, nil, nil},
		{"a name is not a token", bearer("alice"), get("/"), http.StatusUnauthorized, nil, nil},
		{"name:secret is not a token", bearer("alice:s1"), get("/"), http.StatusUnauthorized, nil, nil},
		{"no token", http.Header{}, get("/api/v1/queues"), http.StatusUnauthorized, nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := tc.run(tc.header.Clone())
			assert.Equal(t, tc.wantCode, code, body)
			for _, w := range tc.want {
				assert.Contains(t, body, w)
			}
			for _, nw := range tc.notWant {
				assert.NotContains(t, body, nw)
			}
			for _, secret := range []string{"op-secret", "read-secret", "guest:guest"} {
				assert.NotContains(t, body, secret)
			}
		})
	}
	assert.Equal(t, 1, fx.rabbit.Count(topology.DLQ(q)), "nothing moved")
}

// TestQueryTokenCookie: the cookie ?token= sets works for either kind of token.
func TestQueryTokenCookie(t *testing.T) {
	fx := newFixture(t, func(c *console.Config) { c.Token = "alice:s1"; c.ReadToken = "carol:s2" })
	for _, tc := range []struct{ token, want string }{
		{"s1", "signed in as <strong>alice</strong> (operator)"},
		{"s2", "signed in as <strong>carol</strong> (read-only)"},
	} {
		t.Run(tc.token, func(t *testing.T) {
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			resp, err := client.Get(fx.srv.URL + "/?token=" + tc.token)
			require.NoError(t, err)
			_ = resp.Body.Close()
			require.Equal(t, http.StatusSeeOther, resp.StatusCode)
			assert.Equal(t, "/", resp.Header.Get("Location"), "the token leaves the address bar")
			var cookie *http.Cookie
			for _, c := range resp.Cookies() {
				if c.Name == "sluice_console_token" {
					cookie = c
				}
			}
			require.NotNil(t, cookie)
			assert.True(t, cookie.HttpOnly)
			code, body := fx.do(t, http.MethodGet, "/", "", http.Header{"Cookie": {cookie.String()}})
			assert.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, tc.want)
		})
	}
}

// TestNoAccessControl: without tokens everyone is the loopback operator, and every page
// says there is no access control.
func TestNoAccessControl(t *testing.T) {
	fx := newFixture(t, nil)
	fx.deadLetter(t, "l-1", `{}`, gatewayDown(), nil)
	gateway := groupOf(t, fx, "gateway_down")
	for _, path := range []string{"/", "/queues/" + fx.queue, "/queues/" + fx.queue + "/messages/l-1", "/queues/" + fx.queue + "/confirm?op=archive&id=l-1", "/queues/no.such.queue"} {
		t.Run(path, func(t *testing.T) {
			_, body := fx.get(t, path)
			assert.Contains(t, body, "No access control: loopback only, anyone on this machine can act")
			assert.Contains(t, body, "signed in as <strong>loopback</strong> (operator)")
			assert.NotContains(t, body, "op-disabled")
		})
	}
	code, body := fx.do(t, http.MethodPost, "/api/v1/queues/"+fx.queue+"/archive", `{"group":"`+gateway+`"}`,
		http.Header{console.CSRFHeader: {fx.console.CSRFToken()}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"actor": "console:loopback"`)
	assert.Contains(t, body, `"moved": 1`)
}

// TestActorReachesTheOperator: an action is done as the token's name.
func TestActorReachesTheOperator(t *testing.T) {
	fx := newFixture(t, func(c *console.Config) { c.Token = "alice:s1,s9" })
	fx.deadLetter(t, "x-1", `{}`, gatewayDown(), nil)
	fx.deadLetter(t, "x-2", `{}`, gatewayDown(), nil)
	fx.deadLetter(t, "x-3", `{}`, gatewayDown(), nil)
	csrf := fx.console.CSRFToken()
	cases := []struct {
		name  string
		run   func() (int, string)
		want  string
		moved string
	}{
		{"API as alice", func() (int, string) {
			h := bearer("s1")
			h.Set(console.CSRFHeader, csrf)
			return fx.do(t, http.MethodPost, "/api/v1/queues/"+fx.queue+"/archive", `{"ids":["x-1"]}`, h)
		}, `"actor": "console:alice"`, `"moved": 1`},
		{"form as alice", func() (int, string) {
			h := http.Header{"Cookie": {"sluice_console_token=s1"}, "Content-Type": {"application/x-www-form-urlencoded"}}
			return fx.do(t, http.MethodPost, "/queues/"+fx.queue+"/actions", url.Values{"op": {"purge"}, "id": {"x-2"}, "csrf": {csrf}}.Encode(), h)
		}, "Done as <code>console:alice</code>", "Purged 1 of 1"},
		{"API as the unnamed operator", func() (int, string) {
			h := bearer("s9")
			h.Set(console.CSRFHeader, csrf)
			return fx.do(t, http.MethodPost, "/api/v1/queues/"+fx.queue+"/replay", `{"ids":["x-3"]}`, h)
		}, `"actor": "console:operator"`, `"moved": 1`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := tc.run()
			require.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, tc.want)
			assert.Contains(t, body, tc.moved)
		})
	}
}

func TestParseTokens(t *testing.T) {
	cases := []struct {
		name, value string
		want        []console.Token
		wantErr     bool
	}{
		{"empty", "", nil, false},
		{"bare", "s3", []console.Token{{Name: "operator", Secret: "s3"}}, false},
		{"named", "alice:s1", []console.Token{{Name: "alice", Secret: "s1"}}, false},
		{"several", "alice:s1, bob:s2,s3,", []console.Token{{Name: "alice", Secret: "s1"}, {Name: "bob", Secret: "s2"}, {Name: "operator", Secret: "s3"}}, false},
		{"colon in the secret", "alice:a:b", []console.Token{{Name: "alice", Secret: "a:b"}}, false},
		{"empty secret", "alice:", nil, true},
		{"empty name", ":s1", nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := console.ParseTokens(tc.value, console.DefaultOperatorName)
			if tc.wantErr {
				require.ErrorIs(t, err, console.ErrBadToken)
				assert.NotContains(t, err.Error(), "s1")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
