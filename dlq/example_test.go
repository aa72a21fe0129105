package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/dlq"
)

// These examples need RabbitMQ (the DLQ of a queue sluice declared); they are compiled, not
// run. The library reads no environment variable: a program passes the URL it read.
const rabbitURL = "amqp://guest:guest@127.0.0.1:5672/"

func dial() *amqp.Connection {
	conn, err := amqp.Dial(rabbitURL) // a plain amqp091-go connection; the caller owns it
	if err != nil {
		panic(err)
	}
	return conn
}

// Reading the head of payments.dlq: Messages visits each record, head first, until the
// visit returns false. Reads never consume: every message is back in the queue, in its
// place, when Messages returns.
func ExampleInspector_Messages() {
	conn := dial()
	defer conn.Close()
	n := 0
	total, err := dlq.Inspector{Conn: conn}.Messages(context.Background(), "payments", dlq.Selector{},
		func(r dlq.Record) bool {
			fmt.Println(r.ID, r.ErrorType, r.Retries, r.Age)
			n++
			return n < 20 // the first 20
		})
	if err != nil {
		panic(err)
	}
	fmt.Printf("payments.dlq holds %d\n", total)
}

// Replaying the largest failure group once its cause is fixed. Each batch is one AMQP
// transaction, so a process killed mid-way neither loses nor duplicates a message; the
// action is recorded in the audit trail.
func ExampleOperator_Replay() {
	conn := dial()
	defer conn.Close()
	ctx := context.Background()
	groups, err := dlq.Inspector{Conn: conn}.Groups(ctx, "payments") // largest first
	if err != nil {
		panic(err)
	}
	if len(groups) == 0 {
		return // nothing dead-lettered
	}
	op := dlq.Operator{Conn: conn, Progress: func(p dlq.Progress) { fmt.Printf("%d/%d\n", p.Moved, p.Total) }}
	// DryRun: true would report what would move, changing nothing.
	res, err := op.Replay(ctx, "payments", dlq.Selector{Group: groups[0].ID}, dlq.Options{})
	if err != nil {
		panic(err)
	}
	fmt.Println("replayed", res.Moved, "of", res.Matched)
}

// Correcting one dead letter's payload: the corrected copy goes back to its queue with its
// retry state reset, and the original is archived unchanged (payments.dlq.archive).
func ExampleOperator_Edit() {
	conn := dial()
	defer conn.Close()
	res, err := dlq.Operator{Conn: conn}.Edit(context.Background(), "payments", dlq.Edit{
		ID:         "pay-7",
		Payload:    []byte(`{"payment_id":"pay-7","amount":42}`),
		SetHeaders: map[string]string{"fixed-by": "ticket-123"},
	}, dlq.Options{})
	if err != nil {
		panic(err) // errors.Is(err, dlq.ErrEditRefused): an edit of sluice's own headers
	}
	fmt.Println("edited", res.ID, "original archived in", res.Archive)
}

// Who replayed, archived, purged or edited what: the audit trail, oldest first.
func ExampleReadAudit() {
	conn := dial()
	defer conn.Close()
	events, err := dlq.ReadAudit(context.Background(), conn, dlq.AuditQuery{
		Queue: "payments",
		Since: time.Now().Add(-24 * time.Hour),
	})
	if err != nil {
		panic(err)
	}
	for _, e := range events {
		fmt.Println(e.At.Format(time.RFC3339), e.Actor, e.Action, e.Selector, e.Count, e.Result)
	}
}

// A Selector is what an operation works on; it needs no broker to build. Its String is the
// CLI's spelling of the same selection, as the audit trail records it.
func ExampleSelector() {
	sel := dlq.Selector{ErrorType: "gateway_down", OlderThan: time.Hour}
	fmt.Println(sel)
	// Operations refuse the zero Selector before they touch RabbitMQ: a replay of
	// everything must say All.
	_, err := dlq.Operator{}.Replay(context.Background(), "payments", dlq.Selector{}, dlq.Options{})
	fmt.Println(errors.Is(err, dlq.ErrNoSelector))
	// Output:
	// --error-type gateway_down --older-than 1h0m0s
	// true
}
