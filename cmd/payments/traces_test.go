package main

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

func TestPrintClosing(t *testing.T) {
	const id1, id2 = "0af7651916cd43dd8448eb211c80319c", "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, tc := range []struct {
		name    string
		c       closing
		want    []string
		notWant []string
	}{
		{
			name: "embedded, no exporter: the dead letters end with the process",
			c:    closing{broker: "memory", queue: "payments.requested", dead: 57, exporter: otelsetup.ExporterNone, traces: []string{id1, id2}},
			want: []string{
				"The embedded broker ends with this process: its 57 dead letters (in\npayments.requested.dlq) are gone now.",
				"Run against RabbitMQ (AMQP_URL) to keep them and read them with sluice dlq list",
				"OTEL_EXPORTER_OTLP_ENDPOINT",
			},
			notWant: []string{"/trace/", "sluice console", "METRICS_ADDR"},
		},
		{
			name:    "embedded without dead letters",
			c:       closing{broker: "memory", queue: "q", exporter: otelsetup.ExporterNone},
			want:    []string{"The embedded broker ends with this process"},
			notWant: []string{"dead letters (in", "sluice console"},
		},
		{
			name: "rabbitmq, OTLP, metrics: Jaeger links, the console, the metrics",
			c: closing{broker: "rabbitmq", queue: "payments.requested", dead: 3, exporter: otelsetup.ExporterOTLPHTTP,
				metricsAddr: "127.0.0.1:9464", jaegerUI: "http://127.0.0.1:16686/", traces: []string{id1, id2}},
			want: []string{
				"3 dead letters of this run are in payments.requested.dlq. Read them with:\n  go run ./cmd/sluice dlq list --queue payments.requested\n",
				"\n  go run ./cmd/sluice console --queue payments.requested\n",
				"\n  http://127.0.0.1:16686/trace/" + id1 + "\n  http://127.0.0.1:16686/trace/" + id2 + "\n",
				"go run ./cmd/sluice trace <trace id>",
				"Metrics were served on http://127.0.0.1:9464/metrics while the demo ran.",
			},
			notWant: []string{"embedded", "OTEL_EXPORTER_OTLP_ENDPOINT"},
		},
		{
			name:    "rabbitmq without telemetry says how to get it",
			c:       closing{broker: "rabbitmq", queue: "q", exporter: otelsetup.ExporterNone},
			want:    []string{"shows dead letters, traces too:\n  go run ./cmd/sluice console --queue q\n", "Set OTEL_EXPORTER_OTLP_ENDPOINT", "Set METRICS_ADDR"},
			notWant: []string{"/trace/", "dead letters of this run"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			printClosing(&b, tc.c)
			out := b.String()
			for _, w := range tc.want {
				assert.Contains(t, out, w)
			}
			for _, w := range tc.notWant {
				assert.NotContains(t, out, w)
			}
			for _, l := range strings.Split(out, "\n") {
				assert.LessOrEqual(t, utf8.RuneCountInString(l), demoWidth, "%q", l)
			}
		})
	}
}

func TestJaegerUIURL(t *testing.T) {
	for _, tc := range []struct{ ui, query, want string }{
		{want: "http://127.0.0.1:16686"},
		{query: "http://jaeger:16686", want: "http://jaeger:16686"},
		{ui: "https://tracing.example/jaeger", query: "http://jaeger:16686", want: "https://tracing.example/jaeger"},
		{ui: "https://ops:s3cret@tracing.example", want: "https://ops:xxxxx@tracing.example"},
	} {
		t.Setenv("JAEGER_UI_URL", tc.ui)
		t.Setenv("JAEGER_QUERY_URL", tc.query)
		assert.Equal(t, tc.want, jaegerUIURL())
	}
}
