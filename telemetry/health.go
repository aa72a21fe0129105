package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/sluice-go/sluice/internal/otelnames"
	"go.opentelemetry.io/otel/metric"
)

// Health paths served beside /metrics by otelsetup.Setup's server.
const (
	// LivenessPath answers 200 while the process serves HTTP at all (Kubernetes'
	// livenessProbe: restart the pod when it does not).
	LivenessPath = "/healthz"
	// ReadinessPath answers 200 when every readiness check passes and nothing paused
	// consuming, else 503 naming what is not ready (Kubernetes' readinessProbe).
	ReadinessPath = "/readyz"
)

// Health holds the readiness checks and pauses behind ReadinessPath. It is safe for
// concurrent use; the zero value is ready.
type Health struct {
	mu     sync.RWMutex
	checks []readyCheck
	paused map[string]string // by who paused: why
}

type readyCheck struct {
	name  string
	check func() error
}

// AddReadyCheck adds a check, such as "broker connected" or "consuming"; a non-nil error
// makes the process not ready, with the error's text as the reason.
func (h *Health) AddReadyCheck(name string, check func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checks = append(h.checks, readyCheck{name: name, check: check})
}

// Pause makes the process not ready until Resume(name): what deliberately stops
// consuming (an overload guard, an operator) says so here, so the load balancer and
// Kubernetes see it.
func (h *Health) Pause(name, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.paused == nil {
		h.paused = map[string]string{}
	}
	h.paused[name] = reason
}

// Resume ends Pause(name).
func (h *Health) Resume(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.paused, name)
}

// NotReady returns why the process is not ready, one line per failed check or pause, or
// nothing when it is.
func (h *Health) NotReady() []string {
	h.mu.RLock()
	checks := append([]readyCheck(nil), h.checks...)
	var reasons []string
	for name, why := range h.paused {
		reasons = append(reasons, fmt.Sprintf("paused by %s: %s", name, why))
	}
	h.mu.RUnlock()
	sort.Strings(reasons)
	for _, c := range checks {
		if err := c.check(); err != nil {
			reasons = append(reasons, fmt.Sprintf("%s: %v", c.name, err))
		}
	}
	return reasons
}

// LivenessHandler answers 200 "ok".
func (h *Health) LivenessHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
}

// ReadinessHandler answers 200 "ready" or 503 with the reasons NotReady gives.
func (h *Health) ReadinessHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if reasons := h.NotReady(); len(reasons) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready\n" + strings.Join(reasons, "\n") + "\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
}

// RegisterReady reports otelnames.MetricReady (sluice.ready: 1 while NotReady is empty,
// else 0) from h on m at every collection, so that alerting can see what /readyz says.
func RegisterReady(m metric.Meter, h *Health) error {
	_, err := m.Int64ObservableGauge(otelnames.MetricReady,
		metric.WithDescription("1 while the process is ready (/readyz answers 200), else 0."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			v := int64(1)
			if len(h.NotReady()) > 0 {
				v = 0
			}
			o.Observe(v)
			return nil
		}))
	if err != nil {
		return fmt.Errorf("create gauge %s: %w", otelnames.MetricReady, err)
	}
	return nil
}
