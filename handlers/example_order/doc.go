// Package example_order is the order side of the payment example's saga: an order is
// created, its payment is charged with retries by package example_payment, and a payment
// that finally fails is compensated by cancelling the order.
//
// # The saga
//
//	orders.created      order.created: the checkout, {"order_id","payment_id","amount_cents","currency","source"}
//	  Handler.Create    records the order, pending, and publishes its payment request
//	payments.requested  example_payment.Handler charges it, with sluice's retries
//	payments.succeeded  example_payment.Succeeded
//	  Handler.Paid      marks the order paid, publishes Outcome{Status: paid}
//	payments.failed     example_payment.Failed, the payment's compensation: published by
//	                    the stack beside the final dead letter (router.WithCompensation
//	                    with example_payment.BuildFailed)
//	  Handler.Cancel    cancels the order, publishes Outcome{Status: cancelled}
//	orders.outcomes     Outcome: one per order, the order's end state
//
// # Exactly one end state
//
// Every event arrives at least once, so every step is idempotent, by order id:
//
//   - a second order.created for an order the book knows (another message with the same
//     order_id) is a duplicate: nothing is published (Options.OnDuplicate is told). The
//     redelivery of the message that created the order publishes its payment request again,
//     with the same message id, because the first publish may not have happened; the
//     payment side's idempotency (keyed by payment_id) charges it once.
//   - the first outcome wins. A pending order becomes paid on payment.succeeded or
//     cancelled on payment.failed, and stays so: a paid order is never cancelled, a
//     cancelled one never paid. An outcome event that repeats the order's state (a
//     redelivery) publishes the Outcome again with the same id (OutcomeID), since the
//     first publish may not have happened; the opposite event is a conflict, counted
//     (Book.Conflicts) and otherwise ignored. In this example a conflict cannot happen
//     unless a payment is requested twice and its copies end differently: a real system
//     would refund a charge that arrives for a cancelled order.
//   - an outcome event for an order the book does not know (a payment requested without an
//     order, or none named) is acknowledged and ignored.
//
// The book writes each change before the handler returns, so the stack's confirmed
// publish of the handler's output and the acknowledgement come after it. With a file
// (OpenBook with a path) it survives a crash of the process: a SIGKILL between the write
// and the publish is repaired by the redelivery, as above. One process owns a book file.
package example_order
