package breaker

import (
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Registry hands out one Breaker per dependency name, all configured by the same Config,
// so that handlers calling the same dependency share its breaker. It is safe for
// concurrent use.
type Registry struct {
	cfg Config

	mu       sync.Mutex
	breakers map[string]*Breaker
}

// New validates cfg, applies its defaults and returns an empty Registry.
func New(cfg Config) (*Registry, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	return &Registry{cfg: cfg, breakers: make(map[string]*Breaker)}, nil
}

// Breaker returns the breaker of the named dependency, creating it closed on first use.
// An empty name means "default".
func (r *Registry) Breaker(name string) *Breaker {
	if name == "" {
		name = defaultName
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.breakers[name]
	if !ok {
		b = newBreaker(name, &r.cfg)
		r.breakers[name] = b
	}
	return b
}

// State returns the state of the named dependency's breaker; a name no message has used
// yet is StateClosed.
func (r *Registry) State(name string) State {
	if name == "" {
		name = defaultName
	}
	r.mu.Lock()
	b, ok := r.breakers[name]
	r.mu.Unlock()
	if !ok {
		return StateClosed
	}
	return b.State()
}

// States returns the state of every breaker created so far, by name (for metrics).
func (r *Registry) States() map[string]State {
	r.mu.Lock()
	bs := make([]*Breaker, 0, len(r.breakers))
	for _, b := range r.breakers {
		bs = append(bs, b)
	}
	r.mu.Unlock()
	// Outside r.mu: State may announce transitions, and the hook may call back in.
	states := make(map[string]State, len(bs))
	for _, b := range bs {
		states[b.name] = b.State()
	}
	return states
}

// Middleware guards h with the breaker named by Config.Name or, when that is empty, the
// breaker named after the handler consuming each message (message.HandlerNameFromCtx;
// "default" when the context has none): r.AddMiddleware(reg.Middleware) in a plain
// Watermill router.
func (r *Registry) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return r.NewMiddleware("")(h)
}

// NewMiddleware returns the message.HandlerMiddleware guarding handlers with the breaker of
// the named dependency (the router passes the WithBreaker name, else the handler's name).
// An empty dependency means what Middleware does.
func (r *Registry) NewMiddleware(dependency string) message.HandlerMiddleware {
	if dependency == "" {
		dependency = r.cfg.Name
	}
	if dependency != "" {
		return r.Breaker(dependency).Middleware
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			return r.Breaker(message.HandlerNameFromCtx(msg.Context())).handle(h, msg, nil)
		}
	}
}
