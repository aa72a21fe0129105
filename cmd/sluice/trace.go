package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/sluice-go/sluice/internal/jaeger"
	"github.com/sluice-go/sluice/internal/mask"
	"github.com/sluice-go/sluice/internal/waterfall"
)

// defaultTraceService is the service searched when neither --service nor
// OTEL_SERVICE_NAME names one: the example service's.
const defaultTraceService = "payments"

// traceTimeout bounds a whole `sluice trace`, so an unresponsive Jaeger cannot hang it.
const traceTimeout = 60 * time.Second

const traceAbout = `Draws the life of a message as a waterfall: every delivery attempt with its
time, duration, outcome and error, the broker-side delays between them, the
final outcome and the dead-letter publish. The argument is a trace id (32 hex
digits) or a message id, searched as the span tag messaging.message.id in the
traces of --service.

Jaeger's query API is reached at JAEGER_QUERY_URL (default ` + jaeger.DefaultQueryURL + `).
Spans reach Jaeger a few seconds after they end: a message just processed may
not be found yet.`

func runTrace(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("sluice trace", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	service := e.getenv("OTEL_SERVICE_NAME")
	if service == "" {
		service = defaultTraceService
	}
	fs.StringVar(&service, "service", service, "search the traces of service `S` (default OTEL_SERVICE_NAME, else "+defaultTraceService+")")
	lookback := fs.Duration("lookback", 24*time.Hour, "search traces that started within `D` of now")
	width := fs.Int("width", waterfall.DefaultWidth, "width of the timeline in `N` characters")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: sluice trace [--service S] [--lookback D] [--width N] <message-id | trace-id>\n\n%s\n\nFlags:\n", traceAbout)
		fs.VisitAll(func(fl *flag.Flag) {
			typ, usage := flag.UnquoteUsage(fl)
			if typ != "" {
				typ = " " + typ
			}
			fmt.Fprintf(w, "  --%s%s\n    \t%s\n", fl.Name, typ, usage)
		})
		fmt.Fprintln(w, "\nExit codes: 0 ok, 1 Jaeger unreachable or failing, 2 usage error, 3 no such trace or message.")
	}
	pos, err := parseInterleaved(e, fs, args)
	if err != nil {
		return err
	}
	usageErr := func(format string, a ...any) error {
		return usageErrorf("sluice trace: %s (see 'sluice trace -h')", fmt.Sprintf(format, a...))
	}
	switch {
	case len(pos) != 1:
		return usageErr("want exactly one message id or trace id, got %d arguments", len(pos))
	case strings.TrimSpace(pos[0]) == "":
		return usageErr("the message id or trace id is empty")
	case *lookback <= 0:
		return usageErr("--lookback must be positive, got %s", *lookback)
	case *width < 10:
		return usageErr("--width must be at least 10, got %d", *width)
	case service == "":
		return usageErr("--service is empty")
	}
	id := strings.TrimSpace(pos[0])

	base := e.getenv("JAEGER_QUERY_URL")
	if base == "" {
		base = jaeger.DefaultQueryURL
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	defer transport.CloseIdleConnections()
	client := &jaeger.Client{BaseURL: base, HTTPClient: &http.Client{Transport: transport, Timeout: 15 * time.Second}}
	ctx, cancel := context.WithTimeout(ctx, traceTimeout)
	defer cancel()

	traces, err := findTraces(ctx, client, id, service, *lookback)
	if err != nil {
		return redactErr(err, base)
	}
	var b strings.Builder
	if len(traces) > 1 {
		fmt.Fprintf(&b, "Message %s is in %d traces, oldest first.\n\n", id, len(traces))
	}
	opts := waterfall.Options{Width: *width}
	if !isTraceID(id) || traces[0].TraceID != strings.ToLower(id) {
		opts.MessageID = id
	}
	for i, t := range traces {
		if i > 0 {
			b.WriteString("\n")
		}
		if err := waterfall.Render(&b, t, opts); err != nil {
			return fmt.Errorf("sluice trace: draw trace %s: %w", t.TraceID, err)
		}
	}
	_, err = fmt.Fprint(e.stdout, b.String())
	return err
}

// findTraces returns the trace id names, or else the traces of service that carry the
// message id, oldest first. A failure to reach Jaeger is an ordinary error (exit 1); no
// trace is a not-found error (exit 3).
func findTraces(ctx context.Context, c *jaeger.Client, id, service string, lookback time.Duration) ([]jaeger.Trace, error) {
	// Asking for the services first tells "Jaeger is not there" apart from "no such trace"
	// (Jaeger answers 404 for both a missing trace and a wrong URL), and names the
	// services a mistyped --service could have meant.
	services, err := c.Services(ctx)
	if err != nil {
		return nil, fmt.Errorf("sluice trace: cannot reach Jaeger's query API at %s (is Jaeger running? "+
			"scripts/jaeger-start.sh starts one; JAEGER_QUERY_URL points elsewhere): %w", c.BaseURL, err)
	}
	if isTraceID(id) {
		t, err := c.GetTrace(ctx, id)
		switch {
		case err == nil:
			return []jaeger.Trace{t}, nil
		case !errors.Is(err, jaeger.ErrNotFound):
			return nil, fmt.Errorf("sluice trace: get trace %s from Jaeger: %w", id, err)
		}
		// Not a trace Jaeger has: it may still be a message id that looks like one.
	}

	if !slices.Contains(services, service) {
		known := services
		if len(known) > 10 {
			known = append(known[:10:10], "...")
		}
		have := "none"
		if len(known) > 0 {
			have = strings.Join(known, ", ")
		}
		return nil, notFound(fmt.Errorf("sluice trace: %s: Jaeger at %s has no spans of service %q "+
			"(it has: %s); name the service with --service or OTEL_SERVICE_NAME", noTrace(id), c.BaseURL, service, have))
	}
	traces, err := c.FindTraces(ctx, service, map[string]string{string(semconv.MessagingMessageIDKey): id}, lookback)
	if err != nil {
		return nil, fmt.Errorf("sluice trace: search the traces of message %q in service %q: %w", id, service, err)
	}
	if len(traces) == 0 {
		return nil, notFound(fmt.Errorf("sluice trace: %s in service %q within the last %s "+
			"(spans reach Jaeger seconds after they end; --lookback widens the search, --service changes it)",
			noTrace(id), service, lookback))
	}
	slices.SortStableFunc(traces, func(a, b jaeger.Trace) int {
		return a.Spans[0].StartTime.Compare(b.Spans[0].StartTime)
	})
	return traces, nil
}

// noTrace says that nothing was found for id, as what it was taken for.
func noTrace(id string) string {
	if isTraceID(id) {
		return "no trace " + id + " (nor of a message with that id)"
	}
	return "no trace of message " + id
}

// isTraceID reports whether s is a W3C trace id: 32 hex digits.
func isTraceID(s string) bool {
	if len(s) != 32 {
		return false
	}
	for _, r := range s {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') && (r < 'A' || r > 'F') {
			return false
		}
	}
	return true
}

// parseInterleaved parses args with flags and positional arguments in any order and
// returns the positional ones ("--" ends the flags).
func parseInterleaved(e *env, fs *flag.FlagSet, args []string) ([]string, error) {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(e.stdout) // asked for: not an error
		}
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &codeError{code: exitUsage, err: err, quiet: true}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// redactURL masks JAEGER_QUERY_URL (a proxy in front of Jaeger may want a password) and
// its password wherever text shows them.
func redactURL(text, raw string) string { return mask.Text(text, raw) }

// redactErr is err with redactURL applied, keeping its exit code.
func redactErr(err error, raw string) error {
	msg := redactURL(err.Error(), raw)
	if msg == err.Error() {
		return err
	}
	var ce *codeError
	if errors.As(err, &ce) {
		return &codeError{code: ce.code, err: errors.New(msg), quiet: ce.quiet}
	}
	return errors.New(msg)
}
