package mask

import (
	"regexp"
	"strings"
)

// Masked is what replaces a hidden password or header value.
const Masked = "xxxxx"

// credentialURL matches the user information of any URL that carries a password, whatever
// its scheme: "scheme://user:password@". The password runs to the last "@" before the host
// that no whitespace, quote or slash separates from it, so a password holding an unescaped
// "@" is masked whole.
var credentialURL = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.\-]*://[^\s/?#@:"'<>]*):[^\s/?#"'<>]*@`)

// Credentials returns s with the password of every URL in it replaced by "xxxxx", for
// any scheme (amqp, postgres, https, redis...): for text a producer wrote (a payload, a
// header, an error message) before an operator reads it. Text without such a URL is
// returned unchanged.
func Credentials(s string) string {
	if !strings.Contains(s, "://") {
		return s // the common case, without the regexp
	}
	return credentialURL.ReplaceAllString(s, "${1}:"+Masked+"@")
}

// sensitiveNames are the parts of a header name that mark its value as a credential.
var sensitiveNames = []string{
	"authorization", "auth-token", "auth_token", "authtoken", "api-key", "api_key", "apikey",
	"cookie", "token", "secret", "password", "passwd", "credential", "session", "signature",
	"private-key", "private_key",
}

// SensitiveHeader reports whether a header named name carries a credential whose value is
// never shown: Authorization, Proxy-Authorization, X-Api-Key, Cookie, Set-Cookie and any
// name holding "token", "secret", "password", "credential", "session" or "signature",
// in any case.
func SensitiveHeader(name string) bool {
	n := strings.ToLower(name)
	for _, s := range sensitiveNames {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// Header returns the value of header name as an operator may see it: "xxxxx" for a
// SensitiveHeader, else value with its URLs' passwords masked (Credentials).
func Header(name, value string) string {
	if SensitiveHeader(name) {
		if value == "" {
			return ""
		}
		return Masked
	}
	return Credentials(value)
}
