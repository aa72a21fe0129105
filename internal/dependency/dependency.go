// Package dependency carries, in a message's context, the name of the dependency a
// handler calls: router's breaker step puts the handler's breaker name there, and the retry
// step's overload protection (retry.Overload) counts the message's retries against it.
// Moved from middleware/retry, where it was WithDependency.
package dependency

import "context"

type key struct{}

// With returns ctx naming the dependency whose budget, concurrency limit and load a
// message's retries count against.
func With(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, key{}, name)
}

// From returns the dependency With put in ctx, or "" when none did.
func From(ctx context.Context) string {
	name, _ := ctx.Value(key{}).(string)
	return name
}
