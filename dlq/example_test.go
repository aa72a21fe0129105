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

// Reading the head of payments.dlq. Reads never consume: every message is back in the queue,
// in its place, when List returns.
func ExampleInspector_List() {
	conn := dial()
	defer conn.Close()
	listing, err := dlq.NewInspector(conn).List(context.Background(), "payments", 20)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s holds %d\n", listing.DLQ, listing.Total)
	for _, r := range listing.Records {
		fmt.Println(r.ID, r.ErrorType, r.Retries, r.ShortError(60))
	}
}

// Replaying the largest failure group once its cause is fixed. Each batch is one AMQP
// transaction, so a process killed mid-way neither loses nor duplicates a message; the
// action is recorded in the audit trail.
func ExampleOperator_Replay() {
	conn := dial()
	defer conn.Close()
	ctx := context.Background()
	groups, err := dlq.NewInspector(conn).Groups(ctx, "payments") // largest first
	if err != nil {
		panic(err)
	}
	if len(groups) == 0 {
		return // nothing dead-lettered
	}
	op := dlq.NewOperator(conn)
	op.Progress = func(p dlq.Progress) { fmt.Printf("%d/%d\n", p.Moved, p.Total) }
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
	res, err := dlq.NewOperator(conn).Edit(context.Background(), "payments", dlq.Edit{
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

// A Selector is what an operation works on; it needs no broker to build or test. Its
// String is the CLI's spelling of the same selection, as the audit trail records it.
func ExampleSelector() {
	sel := dlq.Selector{ErrorType: "gateway_down", OlderThan: time.Hour}
	fmt.Println(sel)
	// Operations refuse the zero Selector: a replay of everything must say All.
	fmt.Println(sel.Validate(), errors.Is(dlq.Selector{}.Validate(), dlq.ErrNoSelector))
	r := dlq.Record{ID: "pay-1", ErrorType: "gateway_down", Age: 2 * time.Hour, HasAge: true}
	fmt.Println("selected:", sel.Match(r))
	// Output:
	// --error-type gateway_down --older-than 1h0m0s
	// <nil> true
	// selected: true
}
