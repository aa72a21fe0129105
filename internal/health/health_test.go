package health_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice/internal/health"
)

func TestHealth(t *testing.T) {
	var h health.Health
	var pauses health.Pauses
	h.AddPauses(&pauses)
	connected := true
	h.AddReadyCheck("broker", func() error {
		if !connected {
			return errors.New("not connected to RabbitMQ")
		}
		return nil
	})
	get := func(handler http.Handler) (int, string) {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		return rec.Code, rec.Body.String()
	}
	for _, tc := range []struct {
		name      string
		connected bool
		pause     string
		code      int
		body      string
	}{
		{"ready", true, "", http.StatusOK, "ready\n"},
		{"disconnected", false, "", http.StatusServiceUnavailable, "not ready\nbroker: not connected to RabbitMQ\n"},
		{"paused", true, "queue over its limit", http.StatusServiceUnavailable, "not ready\npaused by overload: queue over its limit\n"},
		{"paused and disconnected", false, "queue over its limit", http.StatusServiceUnavailable,
			"not ready\npaused by overload: queue over its limit\nbroker: not connected to RabbitMQ\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			connected = tc.connected
			if tc.pause != "" {
				pauses.Pause("overload", tc.pause)
				defer pauses.Resume("overload")
			}
			code, body := get(h.ReadinessHandler())
			assert.Equal(t, tc.code, code)
			assert.Equal(t, tc.body, body)
			code, body = get(h.LivenessHandler())
			assert.Equal(t, http.StatusOK, code, "liveness does not depend on readiness")
			assert.Equal(t, "ok\n", body)
		})
	}
}

func TestPauses_ReasonsSortedAndResumed(t *testing.T) {
	var p health.Pauses
	assert.Empty(t, p.Reasons(), "the zero value holds none")
	p.Pause("handler b", "stuck")
	p.Pause("handler a", "paused: circuit breaker gateway open")
	p.Pause("handler b", "still stuck")
	assert.Equal(t, []string{
		"paused by handler a: paused: circuit breaker gateway open",
		"paused by handler b: still stuck",
	}, p.Reasons(), "one line per name, the last reason, sorted")
	p.Resume("handler a")
	p.Resume("nobody")
	assert.Equal(t, []string{"paused by handler b: still stuck"}, p.Reasons())
}
