// Package sluice holds the small vocabulary shared by every sluice step: the failure
// classes a handler returns (Permanent, Discard, RetryAfter, Defer), the metadata keys that
// travel with a message across retries, and the outcome a step reports for an attempt.
//
// The stack itself lives in package router; each step lives in its own package under
// middleware/, and the brokers under broker/. Those packages meet here and in router, never
// import each other.
package sluice
