// Package sluice holds the small vocabulary shared by every sluice step: the failure
// classes a handler returns (Permanent, Discard, RetryAfter, Defer) and the metadata keys
// that travel with a message across retries.
//
// What becomes of a failed attempt is package disposition's: one typed Disposition (ack,
// retry after a delay, defer, dead-letter, discard, give back), decided by
// disposition.Decide from the error's class here and the retry policy, carried out by the
// retry step in one place, and told to the disposition.Observer subscribers (telemetry,
// logs) once per attempt.
//
// The stack itself lives in package router; each step lives in its own package under
// middleware/, and the brokers under broker/. Those packages meet here, in disposition and in
// router; the retry step dead-letters through the poison step it is built with.
package sluice
