package amqp

import "github.com/sluice-go/sluice"

// The error types of this package's errors in failure records (see sluice.ErrorType): a
// handler output that could not be published is retried and, when its retries run out,
// dead-lettered with one of these instead of the generic "error".
func init() {
	sluice.RegisterErrorType(ErrUnroutable, "unroutable")
	sluice.RegisterErrorType(ErrNacked, "broker_nack")
	sluice.RegisterErrorType(errDelayTooLong, "delay_too_long")
}
