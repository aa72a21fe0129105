package decide

import (
	"errors"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
)

// The dead-letter reasons: why a message went to the dead-letter queue, as its
// x-dead-letter-reason header names it. The error type says what failed; the reason says
// why sluice stopped trying.
const (
	// ReasonPermanent: the handler's error was Permanent.
	ReasonPermanent = "permanent"
	// ReasonRetriesExhausted: a retryable error used all of its retries.
	ReasonRetriesExhausted = "retries_exhausted"
	// ReasonMaxAge: a retryable error outlived MaxTotalAge before its retries ran out.
	ReasonMaxAge = "max_age"
	// ReasonDeferralExpired: a deferred message outlived MaxTotalAge.
	ReasonDeferralExpired = "deferral_expired"
	// ReasonRetryUnlikely: the learned retry policy judged a retry unlikely to help.
	ReasonRetryUnlikely = "retry_unlikely"
	// ReasonNoDelay: a retryable or deferred failure with no broker delay to carry it out
	// (the poison step used alone), dead-lettered at once.
	ReasonNoDelay = "no_delay"
	// ReasonFailed: any other dead letter.
	ReasonFailed = "failed"
)

// reasoner is an error that names its own dead-letter reason (the retry budget's refusal
// names "retry_budget_exhausted").
type reasoner interface {
	error
	DeadLetterReason() string
}

// ReasonOf returns why a message dead-lettered for err went there: the first reasoner in
// err's chain, else one of the Reason constants.
func ReasonOf(err error) string {
	if r, ok := errors.AsType[reasoner](err); ok {
		return r.DeadLetterReason()
	}
	switch {
	case errors.Is(err, disposition.ErrRetryUnlikely):
		return ReasonRetryUnlikely
	case errors.Is(err, disposition.ErrDeferralExpired):
		return ReasonDeferralExpired
	}
	if ex, ok := errors.AsType[*ExhaustedError](err); ok {
		if ex.Age > 0 {
			return ReasonMaxAge
		}
		return ReasonRetriesExhausted
	}
	switch sluice.ClassOf(err) {
	case sluice.ClassPermanent:
		return ReasonPermanent
	case sluice.ClassRetryable, sluice.ClassDefer:
		return ReasonNoDelay
	}
	return ReasonFailed
}
