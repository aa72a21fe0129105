package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/demo/paymentdemo"
	"github.com/sluice-go/sluice/internal/jaeger"
	"github.com/sluice-go/sluice/internal/mask"
	"github.com/sluice-go/sluice/internal/otelnames"
	"github.com/sluice-go/sluice/internal/waterfall"
	"github.com/sluice-go/sluice/internal/waterfall/sdkspan"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

// demoWidth is the width the demo's output keeps to: an 80-column terminal.
const demoWidth = 80

// showcase names the two messages whose waterfalls the demo draws: a payment that was
// retried and then charged, and one that was dead-lettered. Empty when the run had none.
type showcase struct {
	retried, deadLettered string // message ids
}

// showcase picks, among this run's settled messages, a payment charged on its third
// attempt (else the one charged after the most attempts) and a payment dead-lettered when
// its retries ran out on gateway timeouts (else after the most attempts), the first in
// publishing order: both show retries, and the second the dead-letter hand-off.
func (t *tally) showcase(reqs []paymentdemo.Request, ids []string, want expected) showcase {
	t.mu.Lock()
	defer t.mu.Unlock()
	var sc showcase
	bestRetried, bestDead := 0, 0
	for i, r := range reqs {
		if r.Kind == paymentdemo.KindDuplicate {
			continue // the copy of a payment charged on its first attempt
		}
		if a := t.attempts[r.PaymentID]; a >= 2 && want.attempts[r.PaymentID] == a {
			// 3 attempts scores highest, then more attempts before fewer.
			score := 2 * a
			if a == 3 {
				score = 1000
			}
			if score > bestRetried {
				sc.retried, bestRetried = ids[i], score
			}
		}
		if typ, ok := t.dead[ids[i]]; ok {
			score := 2 * r.Expect.Attempts
			if typ == example_payment.ErrorTypeGatewayTimeout {
				score++
			}
			if score > bestDead {
				sc.deadLettered, bestDead = ids[i], score
			}
		}
	}
	return sc
}

// traceIDs are the traces of the showcase's messages, in its order, those recorded.
func (sc showcase) traceIDs(spans []sdktrace.ReadOnlySpan) []string {
	var ids []string
	for _, m := range []string{sc.retried, sc.deadLettered} {
		if id, ok := traceOf(spans, m); ok {
			ids = append(ids, id.String())
		}
	}
	return ids
}

// traceOf returns the trace of message id: the trace of its first attempt's span (every
// attempt of a message continues the trace it came with).
func traceOf(spans []sdktrace.ReadOnlySpan, messageID string) (trace.TraceID, bool) {
	if messageID == "" {
		return trace.TraceID{}, false
	}
	for _, s := range spans {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		var id string
		var attempt bool
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case semconv.MessagingMessageIDKey:
				id = kv.Value.AsString()
			case otelnames.AttrAttempt:
				attempt = true
			}
		}
		if attempt && id == messageID {
			return s.SpanContext().TraceID(), true
		}
	}
	return trace.TraceID{}, false
}

// printTraces draws the showcase's waterfalls from the spans recorded in this process,
// with the renderer of `sluice trace`, fitted to demoWidth.
func printTraces(w io.Writer, spans []sdktrace.ReadOnlySpan, sc showcase) {
	if sc.retried == "" && sc.deadLettered == "" {
		return
	}
	fmt.Fprintln(w, "\nTwo payments' traces, from the spans this process recorded, drawn as")
	fmt.Fprintln(w, "sluice trace draws them from Jaeger:")
	for _, m := range []struct{ title, id string }{
		{"Retried, then charged", sc.retried},
		{"Dead-lettered when its retries ran out", sc.deadLettered},
	} {
		if m.id == "" {
			continue
		}
		fmt.Fprintf(w, "\n%s\n", m.title)
		id, ok := traceOf(spans, m.id)
		if !ok {
			fmt.Fprintf(w, "no span of message %s was recorded (OTEL_TRACES_SAMPLER?)\n", m.id)
			continue
		}
		if err := waterfall.Render(w, sdkspan.Trace(spans, id), waterfall.Options{MessageID: m.id, LineWidth: demoWidth}); err != nil {
			fmt.Fprintf(os.Stderr, "payments demo: draw trace %s: %v\n", id, err)
		}
	}
}

// closing is what the demo's last lines are about.
type closing struct {
	broker      string   // the broker's name: "memory" is the embedded one
	queue       string   // the consumed queue
	dead        int      // this run's dead letters
	exporter    string   // otelsetup's span exporter
	metricsAddr string   // where /metrics was served, "" when it was not
	jaegerUI    string   // Jaeger's UI, for the trace links
	traces      []string // the trace ids drawn above
}

// printClosing says where the run's dead letters are, and, when the spans went to an
// OTLP endpoint, where to see the same traces in Jaeger, the console and the metrics.
func printClosing(w io.Writer, c closing) {
	fmt.Fprintln(w)
	embedded := c.broker == "memory"
	switch {
	case embedded && c.dead > 0:
		fmt.Fprintf(w, "The embedded broker ends with this process: its %d dead letters (in\n%s.dlq) are gone now.\n", c.dead, c.queue)
		fmt.Fprintln(w, "Run against RabbitMQ (AMQP_URL) to keep them and read them with sluice dlq list")
	case embedded:
		fmt.Fprintln(w, "The embedded broker ends with this process, and what it held with it.")
	case c.dead > 0:
		fmt.Fprintf(w, "%d dead letters of this run are in %s.dlq. Read them with:\n"+
			"  go run ./cmd/sluice dlq list --queue %s\n", c.dead, c.queue, c.queue)
	}
	if !embedded {
		lead := "The operator console (http://127.0.0.1:8090) shows dead letters, traces too:"
		if c.dead > 0 {
			lead = "or in the operator console (http://127.0.0.1:8090), with their retry trace:"
		}
		fmt.Fprintf(w, "%s\n  go run ./cmd/sluice console --queue %s\n", lead, c.queue)
	}
	if c.exporter == otelsetup.ExporterNone {
		if embedded {
			fmt.Fprintln(w, "(with AMQP_URL and OTEL_EXPORTER_OTLP_ENDPOINT set, this run's traces go to\n"+
				"Jaeger and the console shows them: docs/getting-started.md)")
		} else {
			fmt.Fprintln(w, "Set OTEL_EXPORTER_OTLP_ENDPOINT to send the traces to Jaeger.")
		}
	} else if len(c.traces) > 0 {
		fmt.Fprintln(w, "The same traces in Jaeger:")
		for _, id := range c.traces {
			fmt.Fprintf(w, "  %s/trace/%s\n", strings.TrimRight(c.jaegerUI, "/"), id)
		}
		fmt.Fprintln(w, "or in the terminal: go run ./cmd/sluice trace <trace id>")
	}
	switch {
	case c.metricsAddr != "":
		fmt.Fprintf(w, "Metrics were served on http://%s/metrics while the demo ran.\n", c.metricsAddr)
	case !embedded || c.exporter != otelsetup.ExporterNone:
		fmt.Fprintln(w, "Set METRICS_ADDR (such as 127.0.0.1:9464) to serve the metrics on /metrics.")
	}
}

// jaegerUIURL is Jaeger's UI for the trace links: JAEGER_UI_URL, else JAEGER_QUERY_URL
// (Jaeger serves both on one port), else jaeger.DefaultQueryURL; its password masked.
func jaegerUIURL() string {
	for _, name := range []string{"JAEGER_UI_URL", "JAEGER_QUERY_URL"} {
		if v := strings.TrimSpace(os.Getenv(name)); v != "" {
			return mask.URL(v)
		}
	}
	return jaeger.DefaultQueryURL
}
