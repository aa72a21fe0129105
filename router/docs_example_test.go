package router_test

// The code the guides under docs/ show, compiled here: each snippet there is marked as an
// excerpt of this file, and docs_code_test.go (module root) checks that its lines appear
// here in order. These examples need RabbitMQ, so they have no Output and only compile.

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/middleware/breaker"
	"github.com/sluice-go/sluice/middleware/idempotency"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// connectForDocs connects the guides' examples to RabbitMQ at AMQP_URL.
func connectForDocs() (*amqp.Broker, *router.Stack) {
	broker, err := amqp.Connect(context.Background(), os.Getenv("AMQP_URL"), slog.Default())
	if err != nil {
		panic(err)
	}
	stack, err := router.New(broker, router.Config{})
	if err != nil {
		panic(err)
	}
	return broker, stack
}

// docs/migrating.md, "Using sluice in your own Watermill router": sluice's steps, in the
// stack's order, in a message.Router of your own.
func ownRouter(b *amqp.Broker, r *message.Router, retryCfg retry.Config, guard *idempotency.Guard, breakers *breaker.Registry, handle message.HandlerFunc) error {
	ctx := context.Background()
	if err := b.DeclareQueue(ctx, "payments.requested"); err != nil {
		return err
	}
	mws, closeSteps, err := router.Middlewares(b, router.Config{Retry: retryCfg, Idempotency: guard, Breakers: breakers})
	if err != nil {
		return err
	}
	defer closeSteps()      // after r.Close: unregisters the steps' gauges and listeners
	r.AddMiddleware(mws...) // first added is outermost
	r.AddHandler("payments", "payments.requested", b.Subscriber(broker.SubscribeOptions{Concurrency: 8, Prefetch: 16}),
		"payments.succeeded", b.Publisher(), handle)
	defer r.Close()
	return r.Run(ctx)
}

func ExampleMiddlewares_ownRouter() {
	broker, _ := connectForDocs()
	defer broker.Close()
	guard, _ := idempotency.New(idempotency.Config{})
	defer guard.Close()
	breakers, _ := breaker.New(breaker.Config{})
	r, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	retryCfg := retry.Config{MaxRetries: 5, InitialDelay: time.Second}
	handle := func(msg *message.Message) ([]*message.Message, error) { return nil, nil }
	if err := ownRouter(broker, r, retryCfg, guard, breakers, handle); err != nil {
		panic(err)
	}
}

// docs/concepts.md, "Publish/subscribe": a subscriber's queue bound to a topic exchange,
// its outputs published to another exchange.
func ExampleWithSubscription() {
	broker, stack := connectForDocs()
	defer broker.Close()
	checkOrder := func(msg *message.Message) ([]*message.Message, error) {
		out := message.NewMessage(watermill.NewUUID(), msg.Payload)
		out.Metadata.Set(router.RoutingKeyMetadata, "check.flagged")
		return []*message.Message{out}, nil
	}
	stack.HandleWithOutput("fraud", "fraud.order-checks", "", checkOrder,
		router.WithSubscription(router.Binding{Exchange: "orders", Kind: router.Topic,
			Keys: []string{"order.created", "order.*.eu"}}),
		router.WithOutputExchange(router.Output{Exchange: "fraud", RoutingKey: "check.passed"}))
	// a message can choose its own key: out.Metadata.Set(router.RoutingKeyMetadata, "check.flagged")
	_ = stack.Run(context.Background())
}

// docs/scaling.md, "Scaling out: partitioned queues": payments.requested consumed as eight
// key-partitioned queues.
func ExampleWithPartitions() {
	broker, stack := connectForDocs()
	defer broker.Close()
	handler := example_payment.NewHandler(example_payment.NewGateway())
	stack.HandleWithOutput("payments", "payments.requested", "payments.succeeded", handler.Handle,
		router.WithIdempotencyKey(example_payment.KeyFunc), router.WithPartitions(8))
	_ = stack.Run(context.Background())
}

// ledgerDB stands for a database that writes many rows in one statement.
type ledgerDB struct{}

// InsertEntries writes one ledger entry per message and returns one error per message.
func (ledgerDB) InsertEntries(ctx context.Context, msgs []*message.Message) []error {
	return nil
}

// docs/scaling.md, "Batch handlers": up to 50 messages, or those that came within 100 ms
// of the first, written at once.
func ExampleStack_HandleBatch() {
	broker, stack := connectForDocs()
	defer broker.Close()
	var db ledgerDB
	stack.HandleBatch("ledger", "payments.succeeded", func(ctx context.Context, msgs []*message.Message) []error {
		return db.InsertEntries(ctx, msgs) // one error per message
	}, router.WithBatch(50, 100*time.Millisecond))
	_ = stack.Run(context.Background())
}
