package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Who may do what. SLUICE_CONSOLE_TOKEN (Config.Token) holds operator tokens: every page,
// every read and every action. SLUICE_CONSOLE_READ_TOKEN (Config.ReadToken) holds
// read-only tokens: every page and every GET, and no POST. Each variable is a
// comma-separated list of tokens, each "name:secret" or a bare secret, named "operator"
// or "reader". Without any token the console has no access control (it refuses then
// to listen beyond loopback, see `sluice console`), and everyone is an operator named
// "loopback".

// Role is what an identity may do.
type Role string

const (
	// RoleOperator reads and acts (replay, archive, purge).
	RoleOperator Role = "operator"
	// RoleReader reads only: every POST is refused with 403.
	RoleReader Role = "read-only"
)

// Default names of a token given without "name:".
const (
	DefaultOperatorName = "operator"
	DefaultReaderName   = "reader"
	// loopbackName is who acts when the console has no access control.
	loopbackName = "loopback"
)

// ReadOnlyMessage is why a read-only token's POST is refused.
const ReadOnlyMessage = "this token is read-only (SLUICE_CONSOLE_READ_TOKEN): it can look at every page but not replay, archive or purge; acting needs an operator token from SLUICE_CONSOLE_TOKEN"

// noAccessControl is the line every page shows when the console has no token.
const noAccessControl = "No access control: loopback only, anyone on this machine can act (set SLUICE_CONSOLE_TOKEN / SLUICE_CONSOLE_READ_TOKEN to require tokens)"

// ErrBadToken means a token list does not parse.
var ErrBadToken = errors.New("console: bad token")

// Token is one access token: its holder's name and its secret.
type Token struct {
	Name   string
	Secret string
}

// ParseTokens reads a token list as SLUICE_CONSOLE_TOKEN and SLUICE_CONSOLE_READ_TOKEN
// hold it: comma-separated tokens, each "name:secret" or a bare secret named
// defaultName. Empty means none. Errors (an empty name or secret, a secret given twice)
// never quote a secret.
func ParseTokens(value, defaultName string) ([]Token, error) {
	var out []Token
	for i, part := range strings.Split(value, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		tok := Token{Name: defaultName, Secret: part}
		if name, secret, ok := strings.Cut(part, ":"); ok {
			tok = Token{Name: strings.TrimSpace(name), Secret: strings.TrimSpace(secret)}
		}
		if tok.Name == "" {
			return nil, fmt.Errorf("%w: token %d has an empty name before its colon (want name:secret)", ErrBadToken, i+1)
		}
		if tok.Secret == "" {
			return nil, fmt.Errorf("%w: token %d (%s) has an empty secret (want name:secret)", ErrBadToken, i+1, tok.Name)
		}
		out = append(out, tok)
	}
	return out, nil
}

// credential is a token and the role it grants.
type credential struct {
	Token
	role Role
}

// Identity is who a request comes from.
type Identity struct {
	// Name is the token's name ("loopback" without access control).
	Name string
	Role Role
	// Open is true when the console has no access control.
	Open bool
}

// Operator reports whether id may act.
func (id Identity) Operator() bool { return id.Role == RoleOperator }

// Actor is how the audit trail names id: "console:<name>".
func (id Identity) Actor() string { return "console:" + id.Name }

// identityKey keys a request's Identity in its context.
type identityKey struct{}

// identityOf returns the identity ServeHTTP put in ctx (the loopback operator when there
// is none, as for a Server used without ServeHTTP).
func identityOf(ctx context.Context) Identity {
	if id, ok := ctx.Value(identityKey{}).(Identity); ok {
		return id
	}
	return Identity{Name: loopbackName, Role: RoleOperator, Open: true}
}

// credentials parses cfg's operator and read-only tokens.
func credentials(cfg Config) ([]credential, error) {
	ops, err := ParseTokens(cfg.Token, DefaultOperatorName)
	if err != nil {
		return nil, fmt.Errorf("SLUICE_CONSOLE_TOKEN: %w", err)
	}
	readers, err := ParseTokens(cfg.ReadToken, DefaultReaderName)
	if err != nil {
		return nil, fmt.Errorf("SLUICE_CONSOLE_READ_TOKEN: %w", err)
	}
	var creds []credential
	for _, t := range ops {
		creds = append(creds, credential{t, RoleOperator})
	}
	for _, t := range readers {
		creds = append(creds, credential{t, RoleReader})
	}
	for i := range creds {
		for j := range i {
			if creds[i].Secret == creds[j].Secret {
				return nil, fmt.Errorf("%w: tokens %s and %s have the same secret", ErrBadToken, creds[j].Name, creds[i].Name)
			}
		}
	}
	return creds, nil
}

// match returns the credential whose secret is token. Every secret is compared, in
// constant time, whichever matches.
func (s *Server) match(token string) (credential, bool) {
	var found credential
	ok := false
	if token == "" {
		return found, false
	}
	for _, c := range s.creds {
		if equal(token, c.Secret) && !ok {
			found, ok = c, true
		}
	}
	return found, ok
}

// authenticate returns who r comes from. It writes the response itself and returns false
// when r carries no valid token, or when it carries one as ?token= (remembered in a
// cookie, and the browser sent on without it, so it leaves the address bar).
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (Identity, bool) {
	if len(s.creds) == 0 {
		return Identity{Name: loopbackName, Role: RoleOperator, Open: true}, true
	}
	if q := r.URL.Query().Get("token"); q != "" && r.Method == http.MethodGet {
		if _, ok := s.match(q); ok {
			http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: q, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			u := *r.URL
			v := u.Query()
			v.Del("token")
			u.RawQuery = v.Encode()
			http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
			return Identity{}, false
		}
	}
	if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		if c, ok := s.match(b); ok {
			return Identity{Name: c.Name, Role: c.role}, true
		}
	}
	if ck, err := r.Cookie(tokenCookie); err == nil {
		if c, ok := s.match(ck.Value); ok {
			return Identity{Name: c.Name, Role: c.role}, true
		}
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="sluice console"`)
	http.Error(w, "sluice console: this console needs a token from SLUICE_CONSOLE_TOKEN (operator) or SLUICE_CONSOLE_READ_TOKEN (read-only): send it as Authorization: Bearer <token>, or open the page once with ?token=<token>", http.StatusUnauthorized)
	return Identity{}, false
}

// readOnly refuses r, a request a read-only identity may not make: JSON under /api/, an
// error page elsewhere.
func (s *Server) readOnly(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/api/") {
		s.writeJSON(w, http.StatusForbidden, apiError{Error: ReadOnlyMessage, Status: http.StatusForbidden})
		return
	}
	s.render(w, r, http.StatusForbidden, "error", map[string]any{"Title": "Forbidden", "Status": http.StatusForbidden, "Error": ReadOnlyMessage})
}

// safeMethod reports whether method only reads.
func safeMethod(method string) bool {
	return method == http.MethodGet || method == http.MethodHead
}
