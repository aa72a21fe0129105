package example_payment

// The error types the handler and the gateway return are unexported (callers classify them
// with sluice.ErrorType and the ErrorType constants); the package's tests name them here.
type (
	DecodeError            = decodeError
	ValidationError        = validationError
	InsufficientFundsError = insufficientFundsError
	GatewayTimeoutError    = gatewayTimeoutError
	RateLimitedError       = rateLimitedError
)
