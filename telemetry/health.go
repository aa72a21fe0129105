package telemetry

import (
	"net/http"

	"github.com/sluice-go/sluice/internal/health"
)

// Health holds the readiness checks behind /readyz, and, once otelsetup.Operate gave it a
// stack, the stack's pauses (a breaker open, an idempotency journal restoring, a handler
// stuck with abandoned attempts). otelsetup.Setup serves it beside /metrics
// (otelsetup.Config.Health, Providers.Health). It is safe for concurrent use; the zero
// value is ready.
type Health health.Health

// AddReadyCheck adds a check, such as "broker connected" or "consuming"; a non-nil error
// makes the process not ready, with the error's text as the reason.
func (h *Health) AddReadyCheck(name string, check func() error) {
	(*health.Health)(h).AddReadyCheck(name, check)
}

// LivenessHandler answers 200 "ok" (Kubernetes' livenessProbe: restart the pod when it
// does not), whatever readiness says.
func (h *Health) LivenessHandler() http.Handler { return (*health.Health)(h).LivenessHandler() }

// ReadinessHandler answers 200 "ready" when every check passes and nothing paused
// consuming, else 503 "not ready" and one line per reason: "paused by <who>: <why>" and
// "<check>: <error>" (Kubernetes' readinessProbe).
func (h *Health) ReadinessHandler() http.Handler { return (*health.Health)(h).ReadinessHandler() }
