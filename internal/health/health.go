// Package health is the readiness behind /healthz and /readyz: checks a service adds, and
// the pauses a stack reports (a breaker open, a journal restoring, a handler stuck).
// telemetry.Health is its public face; otelsetup serves it and reads it for sluice.ready,
// and the router keeps its stack's pauses in a Pauses that otelsetup.Operate adds.
package health

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
)

// Health holds the readiness checks and the pauses behind /readyz. It is safe for
// concurrent use; the zero value is ready.
type Health struct {
	mu     sync.RWMutex
	checks []readyCheck
	pauses []*Pauses
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

// AddPauses makes the process not ready while p holds a pause.
func (h *Health) AddPauses(p *Pauses) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pauses = append(h.pauses, p)
}

// NotReady returns why the process is not ready, one line per pause ("paused by <who>:
// <why>", sorted) and then per failed check, or nothing when it is.
func (h *Health) NotReady() []string {
	h.mu.RLock()
	checks := append([]readyCheck(nil), h.checks...)
	pauses := append([]*Pauses(nil), h.pauses...)
	h.mu.RUnlock()
	var reasons []string
	for _, p := range pauses {
		reasons = append(reasons, p.Reasons()...)
	}
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

// Pauses are what deliberately stopped consuming (an open breaker, a journal restoring,
// a stuck handler), by who paused and why: a stack keeps its own, so the load balancer
// and Kubernetes see them once a Health adds them. It is safe for concurrent use; the
// zero value holds none.
type Pauses struct {
	mu     sync.Mutex
	paused map[string]string // by who paused: why
}

// Pause holds a pause by name, with reason, until Resume(name).
func (p *Pauses) Pause(name, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused == nil {
		p.paused = map[string]string{}
	}
	p.paused[name] = reason
}

// Resume ends Pause(name).
func (p *Pauses) Resume(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.paused, name)
}

// Reasons returns one line per pause held, "paused by <who>: <why>", sorted.
func (p *Pauses) Reasons() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.paused))
	for name, why := range p.paused {
		out = append(out, fmt.Sprintf("paused by %s: %s", name, why))
	}
	sort.Strings(out)
	return out
}
