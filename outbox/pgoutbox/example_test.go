package pgoutbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/lib/pq"

	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/outbox/pgoutbox"
)

// An order and its event in one PostgreSQL transaction: the event reaches the broker if and
// only if the order is committed. The forwarder (Run) moves the outbox's rows to the
// broker, confirmed, and deletes each row after its confirm. It needs a PostgreSQL at
// POSTGRES_URL, so it is compiled, not run; the outbox package's tests run the same calls.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("postgres", os.Getenv("POSTGRES_URL"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	b := memory.New(memory.Config{}) // in production sluice's *amqp.Publisher
	defer b.Close()

	box, err := pgoutbox.New(db, b.Publisher(), pgoutbox.Config{Topic: "orders_outbox"})
	if err != nil {
		panic(err)
	}
	defer box.Close()
	go func() { _ = box.Run(ctx) }()
	<-box.Running()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES ($1)`, "o-1"); err != nil {
		panic(err)
	}
	pub, err := box.Publisher(wsql.TxFromStdSQL(tx))
	if err != nil {
		panic(err)
	}
	if err := pub.Publish("orders.created", message.NewMessage("o-1", []byte(`{"order":"o-1"}`))); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil { // the event is forwarded only now
		panic(err)
	}
}

// New checks its Config before it touches the database: the topic names a table.
func ExampleNew_invalidTopic() {
	_, err := pgoutbox.New(nil, nil, pgoutbox.Config{Topic: "orders-outbox"})
	fmt.Println(err)
	// Output: pgoutbox: topic "orders-outbox": want letters, digits and underscores
}
