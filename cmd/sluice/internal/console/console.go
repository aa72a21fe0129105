// Package console is the web application behind `sluice console`: an overview of the queues
// that use sluice's topology, their failure groups, one failed message with its retry
// timeline from Jaeger, replay, archive and purge of a message, a selection or a group,
// edit-and-retry of one message, the archive (browsed and restored like the DLQ) and the
// audit trail of every action, each handler's retry statistics and retry decision matrix,
// and the idempotency journal's figures (from the running service, or Prometheus), as HTML
// pages and as a JSON API under /api/v1/.
//
// Every page is rendered on the server with html/template, so failure records, headers and
// payloads (which a producer controls) are escaped text, never markup; the only script is
// the embedded console.js (the overview's and the groups' pollers, the selection's
// checkboxes), and a Content-Security-Policy forbids any other. Actions are
// POSTs guarded twice against cross-site request forgery: net/http's CrossOriginProtection
// refuses cross-origin browser requests, and each POST must carry the console's
// per-process token (a hidden form field, or the X-CSRF-Token header of an API call).
package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/sluice-go/sluice/internal/mask"
	"github.com/sluice-go/sluice/internal/retrystats"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// ErrNoConnection means Config.Conn is nil.
var ErrNoConnection = errors.New("console: no RabbitMQ connection")

// CSRFHeader is the header an API POST carries the console's CSRF token in.
const CSRFHeader = "X-CSRF-Token"

// tokenCookie keeps an access token a browser gave once as ?token=.
const tokenCookie = "sluice_console_token"

// Config configures a console.
type Config struct {
	// Conn is the RabbitMQ connection every read and action uses. Required.
	Conn *amqp.Connection
	// Queues are the queues the overview shows (each must have a Q.dlq to count as using
	// sluice's topology; see Queues). Empty shows none, and the overview says how to add them.
	Queues []string
	// ManagementURL, when set, is RabbitMQ's management API (http://user:pass@host:15672):
	// the overview then also lists every queue of VHost with a Q.dlq, and unacknowledged
	// counts. Empty means AMQP only (see Queues), or DiscoveryURL.
	ManagementURL string
	// DiscoveryURL, used when ManagementURL is empty, is where the management API may be
	// (DiscoveryTarget derives it from the AMQP URL): the overview tries it with a short
	// timeout (DiscoveryTimeout) and, when it answers, lists the queues it finds as with
	// ManagementURL and says where they came from; when it does not, the overview says
	// why and how to name queues, and it is not tried again for DiscoveryRetry.
	DiscoveryURL string
	// DiscoveryRetry is how long a failed discovery is remembered. Zero means 30s.
	DiscoveryRetry time.Duration
	// VHost is the virtual host the management API lists. Empty means "/".
	VHost string
	// JaegerQueryURL is Jaeger's query API. Empty means no Jaeger: message pages say the
	// timeline is missing and why.
	JaegerQueryURL string
	// JaegerUIURL, when set, makes the timeline link to the trace in Jaeger's UI.
	JaegerUIURL string
	// Service is the service whose traces are searched by message id when a record carries
	// no traceparent. Empty means "payments", the example service.
	Service string
	// Token holds the operator tokens (SLUICE_CONSOLE_TOKEN): comma-separated, each
	// "name:secret" or a bare secret named "operator" (see ParseTokens). An operator reads
	// and acts. When Token or ReadToken is set, every request must carry one of their
	// tokens (Authorization: Bearer, or ?token= once, which a cookie then remembers). Both
	// empty means no access control, everyone an operator: loopback use only.
	Token string
	// ReadToken holds the read-only tokens (SLUICE_CONSOLE_READ_TOKEN), in Token's syntax,
	// a bare secret named "reader": every page and every GET, and every POST refused with
	// 403 (ReadOnlyMessage).
	ReadToken string
	// Secrets are texts (AMQP URLs) masked in every error the console shows.
	Secrets []string
	// Logger logs failed requests. Nil means slog.Default().
	Logger *slog.Logger
	// Timeout bounds one read against RabbitMQ and Jaeger (an action gets at least 10
	// minutes). Zero means 30s.
	Timeout time.Duration
	// ServiceURL is the metrics server of the service whose retries the retry pages show
	// (SLUICE_SERVICE_URL: a URL, or host:port as METRICS_ADDR gives it): its
	// /debug/sluice/retries and /debug/sluice/policy. Empty means
	// retryview.DefaultServiceURL, where `sluice retries` looks too.
	ServiceURL string
	// PrometheusURL (PROMETHEUS_URL), when set, is where the retry pages read the retry
	// statistics instead of the service, over ?window= (default 1h); the decision matrix
	// and the learned policy's verdicts still come from the service. Each page says which
	// it read.
	PrometheusURL string
	// AuditExchange is the audit trail's exchange (and queue): every action is recorded
	// on it and the audit page reads it (see dlq.Operator.AuditExchange). Empty means
	// "sluice.audit".
	AuditExchange string
}

// Server is the console's http.Handler.
type Server struct {
	cfg     Config
	creds   []credential
	disc    discovery
	csrf    string
	pages   map[string]*template.Template
	handler http.Handler
}

// New returns the console configured by cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Conn == nil {
		return nil, ErrNoConnection
	}
	if cfg.Service == "" {
		cfg.Service = "payments"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.DiscoveryRetry <= 0 {
		cfg.DiscoveryRetry = defaultDiscoveryRetry
	}
	creds, err := credentials(cfg)
	if err != nil {
		return nil, err
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, fmt.Errorf("console: csrf token: %w", err)
	}
	s := &Server{cfg: cfg, creds: creds, csrf: hex.EncodeToString(raw[:])}
	if err := s.parseTemplates(); err != nil {
		return nil, err
	}
	s.handler = s.routes()
	return s, nil
}

// CSRFToken returns the token every POST must carry.
func (s *Server) CSRFToken() string { return s.csrf }

func (s *Server) parseTemplates() error {
	s.pages = map[string]*template.Template{}
	funcs := template.FuncMap{"ts": formatTime, "ago": ago, "path": url.PathEscape, "query": url.QueryEscape,
		"add": func(a, b int) int { return a + b }, "fmtf": func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
		"decision": retrystats.Verdict.Text}
	for _, page := range []string{"overview", "queue", "message", "confirm", "result", "error", "edit", "edited", "audit", "retries", "policy", "journal"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return fmt.Errorf("console: parse template %s: %w", page, err)
		}
		s.pages[page] = t
	}
	return nil
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", s.overviewPage)
	mux.HandleFunc("GET /queues/{queue}", s.queuePage)
	mux.HandleFunc("GET /queues/{queue}/messages/{id}", s.messagePage)
	mux.HandleFunc("GET /queues/{queue}/messages/{id}/payload", s.payloadDownload)
	mux.HandleFunc("POST /queues/{queue}/messages/{id}/edit/preview", s.editPreview)
	mux.HandleFunc("POST /queues/{queue}/messages/{id}/edit", s.editForm)
	mux.HandleFunc("GET /queues/{queue}/confirm", s.confirmPage)
	mux.HandleFunc("POST /queues/{queue}/actions", s.actionForm)
	mux.HandleFunc("GET /audit", s.auditPage)
	mux.HandleFunc("GET /retries", s.retriesPage)
	mux.HandleFunc("GET /retries/{handler}", s.retriesPage)
	mux.HandleFunc("GET /policy", s.policyPage)
	mux.HandleFunc("GET /policy/{handler}", s.policyPage)
	mux.HandleFunc("GET /journal", s.journalPage)
	mux.HandleFunc("GET /api/v1/journal", s.apiJournal)
	mux.HandleFunc("GET /api/v1/retries", s.apiRetries)
	mux.HandleFunc("GET /api/v1/policy", s.apiPolicy)
	mux.HandleFunc("GET /api/v1/audit", s.apiAudit)
	mux.HandleFunc("GET /api/v1/csrf", s.apiCSRF)
	mux.HandleFunc("GET /api/v1/queues", s.apiQueues)
	mux.HandleFunc("GET /api/v1/queues/{queue}/groups", s.apiGroups)
	mux.HandleFunc("GET /api/v1/queues/{queue}/messages", s.apiMessages)
	mux.HandleFunc("GET /api/v1/queues/{queue}/messages/{id}", s.apiMessage)
	mux.HandleFunc("POST /api/v1/queues/{queue}/messages/{id}/edit", s.apiEdit)
	mux.HandleFunc("POST /api/v1/queues/{queue}/{op}", s.apiAction)
	return http.NewCrossOriginProtection().Handler(mux)
}

// ServeHTTP checks the access token, sets the security headers and serves the console, with
// the request's Identity in its context. A read-only identity may only GET.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	id, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), identityKey{}, id))
	if !id.Operator() && !safeMethod(r.Method) {
		s.readOnly(w, r)
		return
	}
	s.handler.ServeHTTP(w, r)
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// validCSRF reports whether token is the console's CSRF token.
func (s *Server) validCSRF(token string) bool { return token != "" && equal(token, s.csrf) }

// mask hides the configured secrets in text.
func (s *Server) mask(text string) string {
	return mask.Text(text, append([]string{s.cfg.ManagementURL, s.cfg.DiscoveryURL, s.cfg.ServiceURL, s.cfg.PrometheusURL}, s.cfg.Secrets...)...)
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "unknown"
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

func ago(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}
