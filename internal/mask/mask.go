// Package mask hides broker and Jaeger URLs' passwords in text before it is logged, printed
// or returned as an error: the one implementation the brokers, the dlq tools and the CLI use.
package mask

import (
	"net/url"
	"strings"
)

// URL returns u with its password replaced by "xxxxx", for logs and errors. A string
// that does not parse as a URL is masked whole after the scheme, since it may still hold a
// password. So is anything before an "@" that the URL parser did not take for user
// information: "amqp:user:secret@host" parses as an opaque URL, and
// "amqp://user:12/secret@host" as host "user", port 12 and a path.
func URL(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		if i := strings.Index(u, "://"); i >= 0 {
			return u[:i+3] + "xxxxx"
		}
		return "xxxxx"
	}
	if parsed.User != nil {
		if _, has := parsed.User.Password(); has {
			parsed.User = url.UserPassword(parsed.User.Username(), "xxxxx")
		}
		return parsed.String()
	}
	if at := strings.LastIndex(u, "@"); at >= 0 {
		start := 0
		if i := strings.Index(u, "://"); i >= 0 && i < at {
			start = i + 3
		} else if i := strings.Index(u, ":"); i >= 0 && i < at {
			start = i + 1
		}
		return u[:start] + "xxxxx" + u[at:]
	}
	return parsed.String()
}

// Text returns s with each of urls replaced by its masked form (URL) and each of
// their passwords, decoded, as written (percent-encoded) or query-escaped, by "xxxxx". Use
// it on any text that may quote a broker URL before it is logged or printed.
func Text(s string, urls ...string) string {
	for _, u := range urls {
		if u == "" {
			continue
		}
		s = strings.ReplaceAll(s, u, URL(u))
		parsed, err := url.Parse(u)
		if err != nil {
			// Unparseable: it may still hold a password after the scheme.
			if i := strings.Index(u, "://"); i >= 0 && len(u) > i+3 {
				s = strings.ReplaceAll(s, u[i+3:], "xxxxx")
			}
			continue
		}
		if parsed.User == nil {
			continue
		}
		if pw, ok := parsed.User.Password(); ok && pw != "" {
			s = strings.ReplaceAll(s, pw, "xxxxx")
			if esc := url.QueryEscape(pw); esc != pw {
				s = strings.ReplaceAll(s, esc, "xxxxx")
			}
			if raw := rawPassword(u); raw != "" {
				s = strings.ReplaceAll(s, raw, "xxxxx")
			}
		}
	}
	return s
}

// rawPassword returns the password of u as written in it, percent-encoding and all.
func rawPassword(u string) string {
	rest := u
	if i := strings.Index(rest, "://"); i >= 0 {
		rest = rest[i+3:]
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return ""
	}
	_, pw, ok := strings.Cut(rest[:at], ":")
	if !ok {
		return ""
	}
	return pw
}
