package steptest

import "sync"

// Log records values from concurrent callers, such as a step's event hooks or a fake's
// calls. The zero value is ready to use.
type Log[T any] struct {
	mu     sync.Mutex
	values []T
}

// Add records v.
func (l *Log[T]) Add(v T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.values = append(l.values, v)
}

// All returns a copy of what was recorded, in order.
func (l *Log[T]) All() []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]T(nil), l.values...)
}
