package sluice

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/sluice-go/sluice/internal/panics"
)

// ErrorTypeGeneric is the error type of an error that says nothing about itself: an
// errors.New or fmt.Errorf error with no declared type, no registered sentinel in its chain
// and no named Go type behind it.
const ErrorTypeGeneric = "error"

// ErrorTypePanic is the error type of a recovered panic.
const ErrorTypePanic = "panic"

// modulePath is sluice's module; its error types that wrap another error only add context
// (Permanent, RetryAfter, a give-back, exhausted retries), so ErrorType looks through
// them.
const modulePath = "github.com/sluice-go/sluice"

// registry holds the sentinels registered with RegisterErrorType, in registration order.
var registry struct {
	mu      sync.RWMutex
	entries []registered
}

type registered struct {
	err  error
	name string
}

func init() {
	RegisterErrorType(context.DeadlineExceeded, "deadline_exceeded")
	RegisterErrorType(context.Canceled, "canceled")
}

// RegisterErrorType names the error type of every error that matches sentinel with
// errors.Is, for failure records, metrics, spans and `sluice dlq replay --error-type`:
//
//	var ErrInsufficientFunds = errors.New("insufficient funds")
//
//	func init() { sluice.RegisterErrorType(ErrInsufficientFunds, "insufficient_funds") }
//
// Registering a sentinel again replaces its name. context.DeadlineExceeded
// ("deadline_exceeded") and context.Canceled ("canceled") are registered by sluice. It
// panics on a nil sentinel or an empty name: both are programming errors, found at start-up.
func RegisterErrorType(sentinel error, name string) {
	if sentinel == nil {
		panic("sluice: RegisterErrorType with a nil sentinel")
	}
	if name == "" {
		panic(fmt.Sprintf("sluice: RegisterErrorType(%q) with an empty name", sentinel.Error()))
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	for i, r := range registry.entries {
		if r.err == sentinel {
			registry.entries[i].name = name
			return
		}
	}
	registry.entries = append(registry.entries, registered{err: sentinel, name: name})
}

// registeredType returns the name of the registered sentinel found first in err's tree,
// searched depth first as errors.Is searches it: the outermost one wins, whatever the order
// in which packages registered theirs.
func registeredType(err error) (string, bool) {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	if len(registry.entries) == 0 {
		return "", false
	}
	return matchRegistered(err)
}

func matchRegistered(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	comparable := reflect.TypeOf(err).Comparable()
	is, hasIs := err.(interface{ Is(error) bool })
	for _, r := range registry.entries {
		if (comparable && err == r.err) || (hasIs && is.Is(r.err)) {
			return r.name, true
		}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return matchRegistered(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, inner := range u.Unwrap() {
			if name, ok := matchRegistered(inner); ok {
				return name, true
			}
		}
	}
	return "", false
}

// ErrorType returns the name recorded as an error's type (x-error-type, x-last-error, the
// retry history, the error.type span attribute and metric label). The first rule that
// applies wins:
//
//  1. the ErrorType of the first error in the chain that implements TypedError;
//  2. "panic" for a recovered panic;
//  3. the name of a sentinel registered with RegisterErrorType that the error matches with
//     errors.Is, the outermost in the chain when it holds several (context.DeadlineExceeded
//     is "deadline_exceeded"; sluice's packages register theirs, e.g. "unroutable");
//  4. the Go type of the first error in the chain, searched in the order errors.As uses,
//     that is not a pure wrapper, as package.Type without the pointer star: *net.OpError is
//     "net.OpError", *json.SyntaxError "json.SyntaxError". Pure wrappers are fmt.Errorf's
//     and errors.Join's, github.com/pkg/errors' WithStack and WithMessage, and sluice's own
//     (Permanent, RetryAfter, a failed hand-off, exhausted retries...);
//  5. "error" when the chain holds nothing but errors.New and fmt.Errorf errors.
//
// The name is stable across releases of the code that returns the error as long as its
// declared type, sentinel or Go type stays: give a domain error an ErrorType method, or
// register its sentinel, to choose the name operators filter on.
func ErrorType(err error) string {
	if err == nil {
		return ""
	}
	if typed, ok := typedError(err); ok {
		return typed.ErrorType()
	}
	if _, ok := PanicStack(err); ok {
		return ErrorTypePanic
	}
	if name, ok := registeredType(err); ok {
		return name
	}
	if name, ok := goTypeName(err); ok {
		return name
	}
	return ErrorTypeGeneric
}

// goTypeName returns the Go type of the first error in err's tree that is neither a pure
// wrapper nor a plain text error, depth first as errors.As searches.
func goTypeName(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	if name, ok := namedType(err); ok {
		return name, true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return goTypeName(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, inner := range u.Unwrap() {
			if name, ok := goTypeName(inner); ok {
				return name, true
			}
		}
	}
	return "", false
}

// namedType returns err's own type name, or false when the type only carries text or only
// wraps another error.
func namedType(err error) (string, bool) {
	t := reflect.TypeOf(err)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	pkg, name := t.PkgPath(), t.Name()
	if name == "" {
		return "", false // an unnamed type says nothing an operator could filter on
	}
	switch pkg + "." + name {
	case "errors.errorString", "errors.joinError",
		"fmt.wrapError", "fmt.wrapErrors",
		"github.com/pkg/errors.fundamental", "github.com/pkg/errors.withStack",
		"github.com/pkg/errors.withMessage":
		return "", false
	}
	if pkg == modulePath || strings.HasPrefix(pkg, modulePath+"/") {
		if _, wraps := err.(interface{ Unwrap() error }); wraps {
			return "", false
		}
	}
	// %T names the package as its code does (backoff, not v4); reflect knows only the path.
	return strings.TrimLeft(fmt.Sprintf("%T", err), "*"), true
}

// ErrorMessage returns the text recorded as an error's message (x-error-message,
// x-last-error-message, the retry history, log lines, span status): the error's own text,
// except that a recovered panic reads "panic: <value>". The panic's stack, which the
// recovered panic's text holds (sluice's recoverer writes it as Watermill's Recoverer
// does), is left out; it is kept once, in x-error-stack (see PanicStack).
func ErrorMessage(err error) string {
	if err == nil {
		return ""
	}
	text := err.Error()
	p, ok := recoveredPanic(err)
	if !ok {
		return text
	}
	short := "panic: " + fmt.Sprint(p.Value)
	if full := p.Error(); strings.Contains(text, full) {
		return strings.Replace(text, full, short, 1)
	}
	// A wrapper rewrote the panic's text; the stack starts where Watermill's format says.
	if i := strings.Index(text, ", stacktrace:"); i >= 0 {
		return text[:i]
	}
	return text
}

// recoveredPanic returns the recovered panic in err's chain: sluice's own (the router's
// recoverer, a batch handler's), or Watermill's RecoveredPanicError that a user's own
// Recoverer put there, each as a value or as a pointer. It walks the chain itself first:
// errors.As makes its target escape, two allocations on every failed attempt's several
// calls (the retry path's largest cost in sluice's own code); only a chain with an As
// method, which may claim to be a panic, needs errors.As (for sluice's type only: claiming
// to be Watermill's through an As method is not recognized).
func recoveredPanic(err error) (panics.Error, bool) {
	if p, found := walkChain(err, panicIn); found != foundAsMethod {
		return p, found == foundValue
	}
	var p panics.Error
	if errors.As(err, &p) {
		return p, true
	}
	var pp *panics.Error
	if errors.As(err, &pp) && pp != nil {
		return *pp, true
	}
	return panics.Error{}, false
}

// panicIn matches a recovered panic, by value or by non-nil pointer.
func panicIn(err error) (panics.Error, bool) {
	switch e := err.(type) {
	case panics.Error:
		return e, true
	case *panics.Error:
		if e != nil {
			return *e, true
		}
		return panics.Error{}, false
	}
	return watermillPanic(err)
}

// Watermill's middleware.RecoveredPanicError, recognized by its package path and name and
// read through reflect: importing Watermill's middleware package for this one type would
// compile gobreaker v1 and backoff v5 into every program that uses sluice (issue 53).
const (
	watermillPanicPkg  = "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	watermillPanicType = "RecoveredPanicError"
)

// watermillPanic matches Watermill's RecoveredPanicError, by value or by non-nil pointer,
// as the panic's value (field V) and stack (field Stacktrace). Reading the type's name
// allocates nothing, so an error that is no panic costs no allocation.
func watermillPanic(err error) (panics.Error, bool) {
	t := reflect.TypeOf(err)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t.Name() != watermillPanicType || t.PkgPath() != watermillPanicPkg {
		return panics.Error{}, false
	}
	v := reflect.ValueOf(err)
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return panics.Error{}, false
		}
		v = v.Elem()
	}
	value, stack := v.FieldByName("V"), v.FieldByName("Stacktrace")
	if !value.IsValid() || !value.CanInterface() || stack.Kind() != reflect.String {
		return panics.Error{}, false // a Watermill release changed the type: not a panic sluice knows how to read
	}
	return panics.Error{Value: value.Interface(), Stack: stack.String()}, true
}

// typedError is errors.As(err, &typed) for a TypedError, walking the chain itself first as
// recoveredPanic does: the retry path names each failed attempt's error type twice.
func typedError(err error) (TypedError, bool) {
	if typed, found := walkChain(err, typedIn); found != foundAsMethod {
		return typed, found == foundValue
	}
	var typed TypedError // escapes: only on this path
	if errors.As(err, &typed) {
		return typed, true
	}
	return nil, false
}

func typedIn(err error) (TypedError, bool) {
	typed, ok := err.(TypedError)
	return typed, ok
}

// What walkChain found in a chain.
const (
	foundNothing  = iota // no match and no As method: errors.As would find nothing
	foundValue           // a match, before any As method
	foundAsMethod        // an As method first: only errors.As knows
)

// walkChain walks err's chain in errors.As's order (depth first) up to the first error
// match accepts, or the first with an As method.
func walkChain[T any](err error, match func(error) (T, bool)) (T, int) {
	var zero T
	for err != nil {
		if v, ok := match(err); ok {
			return v, foundValue
		}
		if _, ok := err.(interface{ As(any) bool }); ok {
			return zero, foundAsMethod
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if v, found := walkChain(e, match); found != foundNothing {
					return v, found
				}
			}
			return zero, foundNothing
		default:
			return zero, foundNothing
		}
	}
	return zero, foundNothing
}
