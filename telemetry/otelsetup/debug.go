package otelsetup

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
)

// Paths of the debug endpoints the metrics server answers once ServeStack gave it a stack.
const (
	// DebugPrefix is the prefix of every debug endpoint.
	DebugPrefix = "/debug/sluice/"
	// RetriesPath serves the retry statistics per handler and error type, as JSON
	// (retrystats.Report; ?handler=H keeps H's rows).
	RetriesPath = DebugPrefix + "retries"
	// PolicyPath serves the retry decision matrix (policy.Description) as JSON, or as
	// Markdown with ?format=markdown.
	PolicyPath = DebugPrefix + "policy"
)

// DebugStack is what ServeStack reads of a stack; *router.Stack is one.
type DebugStack interface {
	// RetriesHandler serves the retry statistics; nil when the stack keeps none.
	RetriesHandler() http.Handler
	// PolicyHandler serves the stack's description.
	PolicyHandler() http.Handler
}

// debugMux serves the debug endpoints; ServeStack fills it in, at any time.
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
	RetriesPath: "no retry statistics: the stack keeps them with router.Config.Retry.Stats (retrystats.New) or Retry.Learned",
	PolicyPath:  "no stack to describe: the service has not called Providers.ServeStack",
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
		why = "no such endpoint: the debug endpoints are " + RetriesPath + " and " + PolicyPath
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": why})
}

// ServeStack serves stack's retry statistics on RetriesPath (when it keeps them) and its
// description on PolicyPath, on the metrics server (Config.MetricsAddr) and on
// DebugHandler. A later call replaces the stack served. Operate calls it for a stack that
// is a DebugStack.
func (p *Providers) ServeStack(stack DebugStack) {
	p.debug.set(RetriesPath, stack.RetriesHandler())
	p.debug.set(PolicyPath, stack.PolicyHandler())
}

// DebugHandler serves the debug endpoints (DebugPrefix), for mounting on a server of the
// caller's own: mux.Handle(otelsetup.DebugPrefix, p.DebugHandler()).
func (p *Providers) DebugHandler() http.Handler { return &p.debug }
