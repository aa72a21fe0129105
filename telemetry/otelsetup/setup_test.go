package otelsetup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-go/sluice/telemetry"
	"github.com/sluice-go/sluice/telemetry/otelsetup"
)

// otelEnv are the variables Setup reads; every test starts with all of them empty so the
// machine's environment cannot change its outcome.
var otelEnv = []string{
	"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
	"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
	"OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
}

func clearOTelEnv(t *testing.T) {
	t.Helper()
	for _, name := range otelEnv {
		t.Setenv(name, "")
	}
}

// restoreGlobals puts back the global providers Setup replaces, so tests stay independent.
func restoreGlobals(t *testing.T) {
	t.Helper()
	tp, mp, prop := otel.GetTracerProvider(), otel.GetMeterProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() {
		// Setting a global to the value it has only makes the SDK log a warning.
		if otel.GetTracerProvider() != tp {
			otel.SetTracerProvider(tp)
		}
		if otel.GetMeterProvider() != mp {
			otel.SetMeterProvider(mp)
		}
		if !same(otel.GetTextMapPropagator(), prop) {
			otel.SetTextMapPropagator(prop)
		}
	})
}

// same compares two interface values; a composite propagator is a slice, and comparing
// two of them with == panics.
func same(a, b any) (eq bool) {
	defer func() {
		if recover() != nil {
			eq = false
		}
	}()
	return a == b
}

func shutdown(t *testing.T, p *otelsetup.Providers) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.Shutdown(ctx))
}

func TestSetup_NoEndpoint(t *testing.T) {
	clearOTelEnv(t)
	restoreGlobals(t)

	p, err := otelsetup.Setup(context.Background(), otelsetup.Config{ServiceName: "payments"})
	require.NoError(t, err)

	assert.Equal(t, otelsetup.ExporterNone, p.TracesExporter())
	assert.Empty(t, p.MetricsAddr(), "no metrics server unless asked for")
	assert.Same(t, p.TracerProvider, otel.GetTracerProvider())
	assert.Same(t, p.MeterProvider, otel.GetMeterProvider())
	assert.ElementsMatch(t, []string{"traceparent", "tracestate", "baggage"}, otel.GetTextMapPropagator().Fields())

	// Without an exporter spans still exist, so trace context still travels in headers.
	_, span := otel.Tracer("test").Start(context.Background(), "op")
	assert.True(t, span.SpanContext().IsValid())
	span.End()

	shutdown(t, p)
	require.NoError(t, p.Shutdown(context.Background()), "a second Shutdown is harmless")
}

// A span processor in Config sees every span, with or without an exporter, and Shutdown
// stops feeding it: what a program that prints its own traces (cmd/payments demo) relies on.
func TestSetup_SpanProcessors(t *testing.T) {
	for _, endpoint := range []string{"", "http://127.0.0.1:1"} {
		t.Run("endpoint "+endpoint, func(t *testing.T) {
			clearOTelEnv(t)
			restoreGlobals(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
			t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "100")
			rec := tracetest.NewSpanRecorder()
			p, err := otelsetup.Setup(context.Background(), otelsetup.Config{SpanProcessors: []sdktrace.SpanProcessor{rec}})
			require.NoError(t, err)

			_, span := otel.Tracer("test").Start(context.Background(), "recorded")
			span.End()
			ended := rec.Ended()
			require.Len(t, ended, 1)
			assert.Equal(t, "recorded", ended[0].Name())
			assert.Equal(t, span.SpanContext().TraceID(), ended[0].SpanContext().TraceID())

			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = p.Shutdown(ctx) // the unreachable endpoint may fail the flush
			_, late := otel.Tracer("test").Start(context.Background(), "after shutdown")
			late.End()
			assert.Len(t, rec.Ended(), 1, "after Shutdown the provider sends it no span")
		})
	}
}

func TestSetup_ExporterFromEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    string
		wantErr string
	}{
		{name: "no endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, want: otelsetup.ExporterNone},
		{name: "endpoint defaults to http/protobuf",
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, want: otelsetup.ExporterOTLPHTTP},
		{name: "traces endpoint alone", env: map[string]string{
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces"}, want: otelsetup.ExporterOTLPHTTP},
		{name: "grpc", env: map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, want: otelsetup.ExporterOTLPGRPC},
		{name: "traces protocol wins", env: map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, want: otelsetup.ExporterOTLPGRPC},
		{name: "exporter none", env: map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"}, want: otelsetup.ExporterNone},
		{name: "sdk disabled", env: map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}, want: otelsetup.ExporterNone},
		{name: "http/json is not supported", env: map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, wantErr: `"http/json"`},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: `"zipkin"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearOTelEnv(t)
			restoreGlobals(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}

			p, err := otelsetup.Setup(context.Background(), otelsetup.Config{})
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, p.TracesExporter())
			shutdown(t, p) // nothing buffered: flushing to the closed port sends nothing
		})
	}
}

// otlpReceiver is an OTLP/HTTP endpoint that keeps what it receives.
type otlpReceiver struct {
	mu   sync.Mutex
	reqs []*coltracepb.ExportTraceServiceRequest
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil || req.URL.Path != "/v1/traces" {
		http.Error(w, fmt.Sprintf("bad request to %s: %v", req.URL.Path, err), http.StatusBadRequest)
		return
	}
	var export coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &export); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.reqs = append(r.reqs, &export)
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(nil)
}

// spans returns span name to the service.name of its resource.
func (r *otlpReceiver) spans() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]string)
	for _, req := range r.reqs {
		for _, rs := range req.ResourceSpans {
			service := ""
			for _, kv := range rs.Resource.Attributes {
				if kv.Key == "service.name" {
					service = kv.Value.GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					out[s.Name] = service
				}
			}
		}
	}
	return out
}

func TestSetup_ShutdownFlushesToOTLPHTTP(t *testing.T) {
	tests := []struct {
		name        string
		envService  string
		cfgService  string
		wantService string
	}{
		{name: "service name from config", cfgService: "payments", wantService: "payments"},
		{name: "OTEL_SERVICE_NAME wins", envService: "from-env", cfgService: "payments", wantService: "from-env"},
		{name: "default service name", wantService: "sluice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearOTelEnv(t)
			restoreGlobals(t)
			recv := &otlpReceiver{}
			srv := httptest.NewServer(recv)
			defer srv.Close()
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
			t.Setenv("OTEL_SERVICE_NAME", tt.envService)
			// A long batch delay: only Shutdown's flush can have delivered the span.
			t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")

			p, err := otelsetup.Setup(context.Background(), otelsetup.Config{ServiceName: tt.cfgService, ServiceVersion: "1.2.3"})
			require.NoError(t, err)
			_, span := p.TracerProvider.Tracer("test").Start(context.Background(), "flushed-span")
			span.End()
			assert.Empty(t, recv.spans(), "batched, not sent yet")

			shutdown(t, p)
			assert.Equal(t, map[string]string{"flushed-span": tt.wantService}, recv.spans())
			srv.CloseClientConnections()
		})
	}
}

// get fetches url without keeping the connection, so no client goroutine outlives a test.
func get(url string) (int, string, error) {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func TestSetup_PrometheusEndpoint(t *testing.T) {
	clearOTelEnv(t)
	restoreGlobals(t)
	p, err := otelsetup.Setup(context.Background(), otelsetup.Config{MetricsAddr: "127.0.0.1:0"})
	require.NoError(t, err)
	addr := p.MetricsAddr()
	require.NotEmpty(t, addr)
	assert.True(t, strings.HasPrefix(addr, "127.0.0.1:"), addr)

	in, err := p.Instrumentation()
	require.NoError(t, err)
	_, err = in.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("id", nil))
	require.NoError(t, err)
	reg, err := in.RegisterBreakerState(func() map[string]int { return map[string]int{"gateway": 2} })
	require.NoError(t, err)
	defer func() { require.NoError(t, reg.Unregister()) }()

	code, body, err := get("http://" + addr + "/metrics")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	for _, want := range []string{
		`sluice_messages_total{handler="",otel_scope_name="github.com/sluice-go/sluice/telemetry"`,
		`outcome="ack"`,
		`sluice_handler_duration_seconds_bucket{`,
		`sluice_messages_in_flight{`,
		`sluice_breaker_state{breaker="gateway"`,
		`go_goroutines `,
	} {
		assert.Contains(t, body, want)
	}

	code, _, err = get("http://" + addr + "/other")
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, code, "only /metrics is served")

	shutdown(t, p)
	_, _, err = get("http://" + addr + "/metrics")
	assert.Error(t, err, "the server is closed by Shutdown")
}

func TestSetup_MetricsAddrInUse(t *testing.T) {
	clearOTelEnv(t)
	restoreGlobals(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()

	before := otel.GetTracerProvider()
	_, err = otelsetup.Setup(context.Background(), otelsetup.Config{MetricsAddr: ln.Addr().String()})
	require.Error(t, err)
	assert.Contains(t, err.Error(), ln.Addr().String())
	assert.Same(t, before, otel.GetTracerProvider(), "a failed Setup installs nothing")
}

func TestSetup_MalformedResourceAttributes(t *testing.T) {
	clearOTelEnv(t)
	restoreGlobals(t)
	// The SDK reports a malformed OTEL_RESOURCE_ATTRIBUTES through otel.Handle and keeps
	// the rest; a typo in an optional variable must not stop a consumer from starting.
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=dev,no-equals-sign")
	p, err := otelsetup.Setup(context.Background(), otelsetup.Config{ServiceName: "payments"})
	require.NoError(t, err)
	defer shutdown(t, p)

	got := map[string]string{}
	for _, kv := range p.Resource.Attributes() {
		got[string(kv.Key)] = kv.Value.Emit()
	}
	assert.Equal(t, "payments", got["service.name"])
}

func TestSetup_ServesHealthBesideMetrics(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	// The check is in place before the server answers: ready must not be said early.
	var ready atomic.Bool
	health := &telemetry.Health{}
	health.AddReadyCheck("consumer", func() error {
		if !ready.Load() {
			return errors.New("not consuming")
		}
		return nil
	})
	p, err := otelsetup.Setup(context.Background(), otelsetup.Config{MetricsAddr: "127.0.0.1:0", Health: health})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Shutdown(context.Background())) })
	require.Same(t, health, p.Health())
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + p.MetricsAddr() + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	code, body := get(telemetry.ReadinessPath)
	assert.Equal(t, http.StatusServiceUnavailable, code, "not ready from the first answer")
	assert.Contains(t, body, "consumer: not consuming")
	code, _ = get(telemetry.LivenessPath)
	assert.Equal(t, http.StatusOK, code)
	ready.Store(true)
	code, _ = get(telemetry.ReadinessPath)
	assert.Equal(t, http.StatusOK, code)
	_, metrics := get("/metrics")
	assert.Contains(t, metrics, "\nsluice_ready{")
	assert.Regexp(t, `sluice_ready\{[^}]*\} 1\n`, metrics)

	ready.Store(false)
	code, body = get(telemetry.ReadinessPath)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "consumer: not consuming")
	_, metrics = get("/metrics")
	assert.Regexp(t, `sluice_ready\{[^}]*\} 0\n`, metrics)
}
