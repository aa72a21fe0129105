// Package example_payment is the example a new sluice user reads first: a payment handler,
// the simulated card gateway it charges, and a generator of demo traffic whose every
// message states where it must end up. The project's end-to-end and chaos tests drive it,
// so its behaviour is a contract.
//
// # The flow
//
// A producer publishes a payment request to QueueRequested ("payments.requested"):
//
//	{"payment_id":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"EUR","source":"tok_visa"}
//
// Handler.Handle decodes it (Decode), charges it through a Gateway, and returns one
// Succeeded event, which the stack publishes (with a publisher confirm) to QueueSucceeded
// ("payments.succeeded"):
//
//	{"payment_id":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"EUR","charge_id":"ch_00000001","attempts":1}
//
// What cannot succeed ends in QueueDLQ ("payments.requested.dlq") with its failure record.
//
// The handler is a plain watermill message.HandlerFunc and knows nothing of RabbitMQ,
// retries or tracing; it only says, through the error it returns, what kind of failure it
// met (package sluice's vocabulary). Wiring it into the stack looks like this:
//
//	gw := example_payment.NewGateway()
//	h := example_payment.NewHandler(gw)
//	stack.HandleWithOutput("payments", example_payment.QueueRequested, example_payment.QueueSucceeded,
//		h.Handle, router.WithIdempotencyKey(example_payment.KeyFunc))
//
// # Failures, by card token
//
// The Gateway decides by the request's source, the way card test tokens work, and counts
// attempts per payment ID itself, so the behaviour does not depend on message headers:
//
//	source                  attempts that fail  error returned (class, type)        outcome
//	tok_visa, any other     none                -                                   event on attempt 1
//	tok_insufficient_funds  every               Permanent, "insufficient_funds"     dead letter on attempt 1
//	tok_flaky_N (N = 1..9)  1..N                retryable, "gateway_timeout"        event on attempt N+1
//	tok_timeout             every               retryable, "gateway_timeout"        dead letter when retries run out
//	tok_rate_limited        1                   RetryAfter(2s), "rate_limited"      event on attempt 2, exactly 2 s later
//	tok_panic               every               (the handler panics)                dead letter, with the stack, when retries run out
//
// A request that is not a JSON object is permanent with type "decode"; a missing, empty
// or mistyped field, a non-positive amount or a currency that is not three capital letters
// is permanent with type "validation", and the message names the field and the value.
// Unknown fields are accepted, so producers can add fields first.
//
// The event's attempts field is sluice.RetryCount(msg.Metadata)+1: the stack's retry step
// increments x-retry-count each time it sends the message back for another attempt.
//
// # Idempotency and the honest gateway
//
// A payment requested twice must be charged once. The gateway does not help: it charges
// every time it is asked and keeps a ledger (Gateway.ChargeCount, Gateway.TotalCharges),
// so a test can prove that it is the stack's idempotency step, keyed by KeyFunc (the
// payment ID), that prevents a double charge.
//
// # Demo traffic
//
// DemoMix(n, seed) returns a deterministic mix of requests covering every token,
// duplicates and malformed bodies, each with its Expectation (succeeded on which attempt,
// dead-lettered with which error type, or absorbed as a duplicate), for the demo in
// cmd/payments and for end-to-end tests to assert.
package example_payment
