package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sluice-go/sluice/internal/dlqwire"

	"github.com/sluice-go/sluice/cmd/sluice/internal/console"
	"github.com/sluice-go/sluice/cmd/sluice/internal/retryview"
	"github.com/sluice-go/sluice/internal/amqpurl"
	"github.com/sluice-go/sluice/internal/jaeger"
	"github.com/sluice-go/sluice/internal/mask"
)

// defaultConsoleAddr keeps the console on this machine unless told otherwise.
const defaultConsoleAddr = "127.0.0.1:8090"

const consoleAbout = `Serves the operator console: the queues given with --queue (those with a
Q.dlq) and sluice.unrouted, each queue's failure groups, one failed message with
its retry timeline from Jaeger, and replay, archive and purge of a message or a
group; the same as JSON under /api/v1/.

Which queues: with RABBITMQ_MANAGEMENT_URL (http://user:pass@host:15672) it lists
every queue of the vhost that has a Q.dlq, with unacknowledged counts. Without
--queue and without RABBITMQ_MANAGEMENT_URL it tries the management API where
RabbitMQ serves it by default: http on port 15672 of AMQP_URL's host, with
AMQP_URL's credentials and vhost (2s timeout; a failure is retried at most every
30s, and the overview shows it, password masked, with the remedies: --queue Q,
or enable the rabbitmq_management plugin, or set RABBITMQ_MANAGEMENT_URL).

Access: it listens on 127.0.0.1 unless --addr names another address; then every
request must carry a token (Authorization: Bearer <token>, or ?token=<token> once
in a browser). SLUICE_CONSOLE_TOKEN holds operator tokens (read and act),
SLUICE_CONSOLE_READ_TOKEN read-only tokens (every page and GET; every POST is
refused with 403). Each is a comma-separated list of tokens, "name:secret" or a
bare secret (named "operator" or "reader"), e.g. alice:s1,bob:s2; the name is who
acts in the audit trail (console:<name>). Without any token (loopback only)
there is no access control: anyone on this machine can act.

Retries and Retry policy: each handler's retry statistics (as sluice retries) and
its retry decision matrix (as sluice policy), read from the running service's
metrics server at SLUICE_SERVICE_URL (default ` + retryview.DefaultServiceURL + `: its METRICS_ADDR);
the statistics from Prometheus instead when PROMETHEUS_URL is set. Journal: the
idempotency journal's state, restore, lag and failures (as sluice journal), from the
service's /metrics, or from Prometheus when PROMETHEUS_URL is set. Each page says
which it read.

Reads AMQP_URL, RABBITMQ_MANAGEMENT_URL, JAEGER_QUERY_URL (default ` + jaeger.DefaultQueryURL + `,
"off" for none), JAEGER_UI_URL (links to Jaeger's UI), SLUICE_CONSOLE_TOKEN,
SLUICE_CONSOLE_READ_TOKEN, SLUICE_SERVICE_URL and PROMETHEUS_URL.`

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error {
	for _, q := range strings.Split(v, ",") {
		if q = strings.TrimSpace(q); q != "" {
			*l = append(*l, q)
		}
	}
	return nil
}

func runConsole(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("sluice console", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	addr := fs.String("addr", defaultConsoleAddr, "listen on `host:port`; a non-loopback host requires SLUICE_CONSOLE_TOKEN")
	var queues stringList
	fs.Var(&queues, "queue", "show queue `Q` on the overview (repeatable, or comma-separated)")
	service := e.getenv("OTEL_SERVICE_NAME")
	if service == "" {
		service = defaultTraceService
	}
	fs.StringVar(&service, "service", service, "search the traces of service `S` for a message without a traceparent")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sluice console [--addr host:port] [--queue Q]... [--service S]\n\n%s\n\nFlags:\n", consoleAbout)
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("sluice console: unexpected argument %q", pos[0])
	}
	token, readToken := e.getenv("SLUICE_CONSOLE_TOKEN"), e.getenv("SLUICE_CONSOLE_READ_TOKEN")
	operators, err := console.ParseTokens(token, console.DefaultOperatorName)
	if err != nil {
		return usageErrorf("sluice console: SLUICE_CONSOLE_TOKEN: %v", err)
	}
	readers, err := console.ParseTokens(readToken, console.DefaultReaderName)
	if err != nil {
		return usageErrorf("sluice console: SLUICE_CONSOLE_READ_TOKEN: %v", err)
	}
	loopback, err := isLoopback(*addr)
	if err != nil {
		return usageErrorf("sluice console: --addr %q: %v", *addr, err)
	}
	if !loopback && len(operators)+len(readers) == 0 {
		return usageErrorf("sluice console: --addr %s is reachable from other machines: set SLUICE_CONSOLE_TOKEN to the operator token every request must carry, or SLUICE_CONSOLE_READ_TOKEN for read-only access (or listen on 127.0.0.1)", *addr)
	}

	amqpURL := e.getenv("AMQP_URL")
	if amqpURL == "" {
		amqpURL = amqpurl.Default
	}
	urls := strings.Split(amqpURL, ",")
	conn, err := dlqwire.Dial(urls...)
	if err != nil {
		return fmt.Errorf("sluice console: %w", dlqwire.MaskError(err, urls...))
	}
	defer conn.Close()

	jaegerURL := e.getenv("JAEGER_QUERY_URL")
	switch jaegerURL {
	case "":
		jaegerURL = jaeger.DefaultQueryURL
	case "off":
		jaegerURL = ""
	}
	mgmtURL := e.getenv("RABBITMQ_MANAGEMENT_URL")
	var discoveryURL string
	if len(queues) == 0 && mgmtURL == "" {
		// Neither queues nor the management API named: look for the API where RabbitMQ
		// serves it by default. DiscoveryTarget only fails on a URL Dial took, so hardly.
		discoveryURL, _, _ = console.DiscoveryTarget(urls[0])
	}
	// The same variables as sluice retries and sluice policy, so the pages and the
	// commands show the same service.
	serviceURL, promURL := e.getenv("SLUICE_SERVICE_URL"), strings.TrimSpace(e.getenv("PROMETHEUS_URL"))
	retrySrc := retryview.Source{ServiceURL: serviceURL, PrometheusURL: promURL}
	logger := slog.New(slog.NewTextHandler(e.stderr, nil))
	c, err := console.New(console.Config{
		Conn: conn, Queues: queues, JaegerQueryURL: jaegerURL, JaegerUIURL: e.getenv("JAEGER_UI_URL"),
		ManagementURL: mgmtURL, DiscoveryURL: discoveryURL, VHost: vhostOf(urls[0]),
		Service: service, Token: token, ReadToken: readToken,
		ServiceURL: serviceURL, PrometheusURL: promURL,
		Secrets: append(urls, jaegerURL, mgmtURL, discoveryURL, serviceURL, promURL), Logger: logger,
	})
	if err != nil {
		return fmt.Errorf("sluice console: %w", err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("sluice console: listen on %s: %w", *addr, err)
	}
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second}
	// One write, so whoever reads the output sees the whole banner once it sees the address.
	var banner strings.Builder
	if loopback {
		fmt.Fprintf(&banner, "sluice console: http://%s/ (this machine only)\n", ln.Addr())
	} else {
		fmt.Fprintf(&banner, "sluice console: http://%s/ is reachable from other machines: every request must carry SLUICE_CONSOLE_TOKEN or SLUICE_CONSOLE_READ_TOKEN (Authorization: Bearer <token>, or ?token=<token> once in a browser)\n", ln.Addr())
	}
	fmt.Fprintf(&banner, "sluice console: %s\n", accessLine(operators, readers))
	fmt.Fprintf(&banner, "sluice console: RabbitMQ %s, Jaeger %s\n", mask.URL(strings.TrimSpace(urls[0])), orNone(jaegerURL))
	fmt.Fprintf(&banner, "sluice console: retry statistics from %s, retry policy from the service at %s\n", retrySrc.Describe(), mask.URL(retrySrc.Service()))
	if discoveryURL != "" {
		fmt.Fprintf(&banner, "sluice console: no --queue and no RABBITMQ_MANAGEMENT_URL: discovering queues through the management API at %s\n", mask.URL(discoveryURL))
	}
	fmt.Fprint(e.stdout, banner.String())

	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("sluice console: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdown)
	if serr := <-done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

// accessLine says who may do what: the names of the tokens, never their secrets.
func accessLine(operators, readers []console.Token) string {
	if len(operators)+len(readers) == 0 {
		return "no access control: anyone on this machine can act"
	}
	names := func(ts []console.Token) string {
		if len(ts) == 0 {
			return "none"
		}
		n := make([]string, len(ts))
		for i, t := range ts {
			n[i] = t.Name
		}
		return strings.Join(n, ", ")
	}
	return "operators: " + names(operators) + "; read-only: " + names(readers)
}

// isLoopback reports whether addr's host only accepts connections from this machine. An
// empty host listens on every interface.
func isLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}

// vhostOf returns the virtual host an AMQP URL names ("/" when it names none).
func vhostOf(amqpURL string) string {
	u, err := url.Parse(strings.TrimSpace(amqpURL))
	if err != nil || u.Path == "" || u.Path == "/" {
		return "/"
	}
	return strings.TrimPrefix(u.Path, "/")
}

func orNone(s string) string {
	if s == "" {
		return "off (no timelines)"
	}
	return s
}
