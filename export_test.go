package sluice

// ErrDeferred is the reason of a Defer given none, for the package's external tests.
var ErrDeferred = errDeferred
