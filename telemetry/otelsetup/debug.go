package otelsetup

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
)

// Paths of the debug endpoints the metrics server answers once Operate gave it a stack.
const (
	// DebugPrefix is the prefix of every debug endpoint: /debug/sluice/retries serves the
	// retry statistics per handler and error type as JSON (?handler=H keeps H's rows),
	// /debug/sluice/policy the retry decision matrix (policy.Description) as JSON, or as
	// Markdown with ?format=markdown.
	DebugPrefix = "/debug/sluice/"
	// retriesPath serves the retry statistics.
	retriesPath = DebugPrefix + "retries"
	// policyPath serves the retry decision matrix.
	policyPath = DebugPrefix + "policy"
)

// debugMux serves the debug endpoints; Operate fills it in, at any time.
type debugMux struct {
	mu       sync.RWMutex
	handlers map[string]http.Handler
}

func (d *debugMux) set(path string, h http.Handler) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.handlers == nil {
		d.handlers = map[string]http.Handler{}
	}
	if h == nil {
		delete(d.handlers, path)
		return
	}
	d.handlers[path] = h
}

// why an endpoint is not served, for its 404.
var notServed = map[string]string{
	retriesPath: "no retry statistics: the stack keeps them with router.Config.Retry.Stats (retrystats.New) or Retry.Learned",
	policyPath:  "no stack to describe: the service has not called Providers.Operate",
}

func (d *debugMux) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	path := strings.TrimSuffix(req.URL.Path, "/")
	d.mu.RLock()
	h := d.handlers[path]
	d.mu.RUnlock()
	if h != nil {
		h.ServeHTTP(w, req)
		return
	}
	why, known := notServed[path]
	if !known {
		why = "no such endpoint: the debug endpoints are " + retriesPath + " and " + policyPath
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": why})
}

// DebugHandler serves the debug endpoints (DebugPrefix) of the stack Operate was given
// (the last one, when it was given several), for mounting on a server of the caller's
// own: mux.Handle(otelsetup.DebugPrefix, p.DebugHandler()).
func (p *Providers) DebugHandler() http.Handler { return &p.debug }
