// Package otelsetup is what an application imports to run the OpenTelemetry SDK for
// sluice: tracer and meter providers built from the OTEL_* environment, an OTLP span
// exporter, a Prometheus registry, and an HTTP server for /metrics, /healthz and /readyz
// (and, once Providers.ServeStack gave it a stack, /debug/sluice/retries and
// /debug/sluice/policy).
// Package telemetry, which the library's core imports, depends on the OpenTelemetry API
// only; a program that does not import otelsetup compiles no SDK, exporter, gRPC or
// Prometheus client.
package otelsetup

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/sluice-go/sluice/telemetry"
)

// defaultServiceName is service.name when neither OTEL_SERVICE_NAME nor
// Config.ServiceName says otherwise.
const defaultServiceName = "sluice"

// The values TracesExporter reports.
const (
	// ExporterNone: spans are created (trace context still propagates) but not exported.
	ExporterNone = "none"
	// ExporterOTLPHTTP: spans are exported with OTLP over HTTP (protobuf).
	ExporterOTLPHTTP = "otlp/http"
	// ExporterOTLPGRPC: spans are exported with OTLP over gRPC.
	ExporterOTLPGRPC = "otlp/grpc"
)

// Config configures Setup. The OTEL_* environment variables configure the rest: the
// OTLP endpoint, protocol, headers and timeouts (OTEL_EXPORTER_OTLP_*), the sampler
// (OTEL_TRACES_SAMPLER), the batch span processor (OTEL_BSP_*), resource attributes
// (OTEL_RESOURCE_ATTRIBUTES) and service.name (OTEL_SERVICE_NAME).
type Config struct {
	// ServiceName is service.name unless OTEL_SERVICE_NAME is set. Empty means
	// defaultServiceName.
	ServiceName string
	// ServiceVersion is service.version. Empty leaves it out.
	ServiceVersion string
	// MetricsAddr is the TCP address (for example "127.0.0.1:9464") of an HTTP server
	// that serves the metrics in Prometheus format on /metrics, and /healthz and /readyz
	// (see Config.Health). Empty starts no server;
	// Providers.MetricsHandler still serves them from the caller's own server.
	MetricsAddr string
	// Health holds the checks behind /readyz. Nil means a new Health without checks,
	// which is ready; a service that must not look ready while it starts passes one whose
	// checks already fail, since the server answers from the moment Setup returns.
	Health *telemetry.Health
	// SpanProcessors also receive every span, beside the OTLP exporter (if there is one):
	// an in-memory recorder, for a program that shows its own traces. Shutdown shuts them
	// down with the tracer provider.
	SpanProcessors []sdktrace.SpanProcessor
}

// Providers are the tracer and meter providers Setup built and installed globally.
type Providers struct {
	// TracerProvider exports spans through the OTLP exporter, if there is one.
	TracerProvider *sdktrace.TracerProvider
	// MeterProvider is read by the Prometheus exporter.
	MeterProvider *sdkmetric.MeterProvider
	// Propagator is W3C TraceContext and Baggage.
	Propagator propagation.TextMapPropagator
	// Resource describes this process (service.name and the rest) on every span and metric.
	Resource *resource.Resource

	exporter     string
	health       *telemetry.Health
	closeIdle    func()
	registry     *prometheus.Registry
	server       *http.Server
	listener     net.Listener
	serveDone    chan struct{}
	shutdownOnce sync.Once
	shutdownErr  error
	debug        debugMux // ServeStack's endpoints (debug.go)
}

// Setup builds the providers from cfg and the OTEL_* environment, installs them and the
// propagator globally (otel.SetTracerProvider, otel.SetMeterProvider,
// otel.SetTextMapPropagator), and starts the metrics server if cfg.MetricsAddr is set.
//
// Spans are exported with OTLP only when OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
// OTEL_EXPORTER_OTLP_ENDPOINT is set (and neither OTEL_TRACES_EXPORTER=none nor
// OTEL_SDK_DISABLED=true), over the protocol OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
// OTEL_EXPORTER_OTLP_PROTOCOL names: "http/protobuf" (the default) or "grpc". Without an
// exporter spans are still created, so trace context still travels in message headers.
//
// The caller must call Shutdown, which flushes spans and stops the metrics server.
func Setup(ctx context.Context, cfg Config) (*Providers, error) {
	res, err := newResource(ctx, cfg)
	if err != nil {
		return nil, err
	}
	p := &Providers{
		Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		Resource:   res,
		registry:   prometheus.NewRegistry(),
		health:     cfg.Health,
	}
	if p.health == nil {
		p.health = &telemetry.Health{}
	}

	exp, kind, closeIdle, err := newTraceExporter(ctx)
	if err != nil {
		return nil, err
	}
	p.exporter, p.closeIdle = kind, closeIdle
	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if exp != nil {
		tpOpts = append(tpOpts, sdktrace.WithBatcher(exp))
	}
	for _, sp := range cfg.SpanProcessors {
		tpOpts = append(tpOpts, sdktrace.WithSpanProcessor(sp))
	}
	p.TracerProvider = sdktrace.NewTracerProvider(tpOpts...)

	// A registry of our own, not prometheus.DefaultRegisterer: Setup may run more than
	// once in a process (tests), and registering twice in the default one fails.
	p.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reader, err := otelprom.New(otelprom.WithRegisterer(p.registry))
	if err != nil {
		_ = p.TracerProvider.Shutdown(ctx)
		return nil, fmt.Errorf("create prometheus exporter: %w", err)
	}
	p.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(reader))
	if err := telemetry.RegisterReady(p.MeterProvider.Meter(telemetry.ScopeName), p.health); err != nil {
		_ = p.TracerProvider.Shutdown(ctx)
		_ = p.MeterProvider.Shutdown(ctx)
		return nil, err
	}

	if cfg.MetricsAddr != "" {
		if err := p.serveMetrics(cfg.MetricsAddr); err != nil {
			_ = p.TracerProvider.Shutdown(ctx)
			_ = p.MeterProvider.Shutdown(ctx)
			return nil, err
		}
	}

	otel.SetTracerProvider(p.TracerProvider)
	otel.SetMeterProvider(p.MeterProvider)
	otel.SetTextMapPropagator(p.Propagator)
	return p, nil
}

func newResource(ctx context.Context, cfg Config) (*resource.Resource, error) {
	name := cfg.ServiceName
	if name == "" {
		name = defaultServiceName
	}
	attrs := []resource.Option{resource.WithAttributes(semconv.ServiceName(name))}
	if cfg.ServiceVersion != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceVersion(cfg.ServiceVersion)))
	}
	// Later options win: the environment overrides cfg, as the OTEL_* contract expects.
	opts := append([]resource.Option{
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithProcessPID(),
		resource.WithProcessRuntimeName(),
		resource.WithProcessRuntimeVersion(),
	}, attrs...)
	opts = append(opts, resource.WithFromEnv())
	res, err := resource.New(ctx, opts...)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		// A detector that found part of its attributes is not worth failing startup for;
		// a malformed OTEL_RESOURCE_ATTRIBUTES is.
		return nil, fmt.Errorf("build resource: %w", err)
	}
	return res, nil
}

// newTraceExporter returns the OTLP exporter the environment asks for, or nil and
// ExporterNone. The exporters read the endpoint, headers, TLS and timeouts themselves.
// closeIdle, never nil, closes the exporter's idle connections after its shutdown.
func newTraceExporter(ctx context.Context) (exp sdktrace.SpanExporter, kind string, closeIdle func(), err error) {
	closeIdle = func() {}
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, ExporterNone, closeIdle, nil
	}
	switch name := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); name {
	case "", "otlp":
	case "none":
		return nil, ExporterNone, closeIdle, nil
	default:
		return nil, "", nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q is not supported (want otlp or none)", name)
	}
	if firstEnv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") == "" {
		return nil, ExporterNone, closeIdle, nil
	}
	protocol := firstEnv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
	switch protocol {
	case "", "http/protobuf":
		var opts []otlptracehttp.Option
		if client, transport := ownHTTPClient(); client != nil {
			opts = append(opts, otlptracehttp.WithHTTPClient(client))
			closeIdle = transport.CloseIdleConnections
		}
		exp, err := otlptracehttp.New(ctx, opts...)
		if err != nil {
			return nil, "", nil, fmt.Errorf("create OTLP/HTTP trace exporter: %w", err)
		}
		return exp, ExporterOTLPHTTP, closeIdle, nil
	case "grpc":
		// The gRPC exporter closes its connection on shutdown.
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, "", nil, fmt.Errorf("create OTLP/gRPC trace exporter: %w", err)
		}
		return exp, ExporterOTLPGRPC, closeIdle, nil
	default:
		return nil, "", nil, fmt.Errorf("OTLP protocol %q is not supported (want http/protobuf or grpc)", protocol)
	}
}

// tlsEnv are the variables that configure the OTLP/HTTP exporter's TLS, which it applies
// only to an HTTP client of its own.
var tlsEnv = []string{
	"OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
	"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
	"OTEL_EXPORTER_OTLP_CLIENT_KEY", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
}

// ownHTTPClient returns an HTTP client for the OTLP/HTTP exporter with a transport of our
// own, or nil when TLS variables are set and the exporter must build its client itself.
//
// The exporter's own client shares a package-level transport whose keep-alive
// connections (and their goroutines) outlive Shutdown for up to 90 s; with our transport
// Shutdown closes them. A client we pass replaces the exporter's handling of the TLS and
// timeout variables, so the timeout is read here, as the exporter would.
func ownHTTPClient() (*http.Client, *http.Transport) {
	if firstEnv(tlsEnv...) != "" {
		return nil, nil
	}
	var transport *http.Transport
	if dt, ok := http.DefaultTransport.(*http.Transport); ok {
		transport = dt.Clone()
	} else {
		transport = &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true}
	}
	timeout := 10 * time.Second
	if raw := firstEnv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"); raw != "" {
		if ms, err := strconv.Atoi(raw); err == nil && ms > 0 {
			timeout = time.Duration(ms) * time.Millisecond
		} else {
			otel.Handle(fmt.Errorf("ignoring OTLP timeout %q: want a positive number of milliseconds", raw))
		}
	}
	return &http.Client{Transport: transport, Timeout: timeout}, transport
}

// firstEnv returns the first non-empty value among the named environment variables.
func firstEnv(names ...string) string {
	for _, n := range names {
		if v := strings.TrimSpace(os.Getenv(n)); v != "" {
			return v
		}
	}
	return ""
}

// serveMetrics listens before returning, so that a taken or malformed address fails
// Setup instead of a background goroutine.
func (p *Providers) serveMetrics(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen for metrics on %q: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", p.MetricsHandler())
	mux.Handle(telemetry.LivenessPath, p.health.LivenessHandler())
	mux.Handle(telemetry.ReadinessPath, p.health.ReadinessHandler())
	mux.Handle(DebugPrefix, &p.debug)
	p.listener = ln
	p.server = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	p.serveDone = make(chan struct{})
	go func() {
		defer close(p.serveDone)
		if err := p.server.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			otel.Handle(fmt.Errorf("serve metrics on %s: %w", ln.Addr(), err))
		}
	}()
	return nil
}

// MetricsHandler serves the metrics in Prometheus text format, for mounting on a server
// of the caller's own.
func (p *Providers) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(p.registry, promhttp.HandlerOpts{})
}

// Health returns the readiness checks and pauses the metrics server answers on
// telemetry.ReadinessPath (and telemetry.LivenessPath); add the process's checks to it.
func (p *Providers) Health() *telemetry.Health { return p.health }

// MetricsAddr returns the address the metrics server listens on (with the port chosen
// when Config.MetricsAddr asked for port 0), or "" if there is no server.
func (p *Providers) MetricsAddr() string {
	if p.listener == nil {
		return ""
	}
	return p.listener.Addr().String()
}

// TracesExporter names the span exporter in use: ExporterNone, ExporterOTLPHTTP or
// ExporterOTLPGRPC.
func (p *Providers) TracesExporter() string { return p.exporter }

// Instrumentation returns a new Instrumentation over these providers and propagator;
// opts may add to or override them.
func (p *Providers) Instrumentation(opts ...telemetry.Option) (*telemetry.Instrumentation, error) {
	return telemetry.New(append([]telemetry.Option{
		telemetry.WithTracerProvider(p.TracerProvider),
		telemetry.WithMeterProvider(p.MeterProvider),
		telemetry.WithPropagator(p.Propagator),
	}, opts...)...)
}

// Shutdown stops the metrics server, flushes and exports the spans still buffered, and
// shuts the providers down, within ctx's deadline. It returns the errors of all three;
// calling it again returns the first call's result. The providers stay installed
// globally and drop whatever is recorded after Shutdown.
func (p *Providers) Shutdown(ctx context.Context) error {
	p.shutdownOnce.Do(func() {
		var errs []error
		if p.server != nil {
			if err := p.server.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("stop metrics server: %w", err))
				_ = p.server.Close()
			}
			<-p.serveDone
		}
		if err := p.TracerProvider.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("shut down tracer provider: %w", err))
		}
		if p.closeIdle != nil {
			p.closeIdle()
		}
		if err := p.MeterProvider.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("shut down meter provider: %w", err))
		}
		p.shutdownErr = errors.Join(errs...)
	})
	return p.shutdownErr
}
