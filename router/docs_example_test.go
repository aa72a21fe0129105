package router_test

// The code the guides under docs/ show, compiled here: each snippet there is marked as an
// excerpt of this file, and docs_code_test.go (module root) checks that its lines appear
// here in order. The guides' services connect to RabbitMQ (amqp.Connect); these examples
// run the same stack code on the embedded broker and check their output, except
// ExampleMiddlewares_ownRouter, which shows an *amqp.Broker as docs/migrating.md says and
// only compiles (ExampleMiddlewares runs the same steps on the embedded broker).

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/broker/memory"
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

// docsStack is a stack on the embedded broker, for the guides' examples that run.
func docsStack(cfg router.Config) (*memory.Broker, *router.Stack) {
	quiet := slog.New(slog.DiscardHandler)
	cfg.Logger = quiet
	broker := memory.New(memory.Config{Logger: quiet})
	stack, err := router.New(broker, cfg)
	if err != nil {
		panic(err)
	}
	return broker, stack
}

// runForDocs runs stack until the returned stop is called.
func runForDocs(stack *router.Stack) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- stack.Run(ctx) }()
	select {
	case <-stack.Running():
	case err := <-done:
		panic(err)
	}
	return func() {
		_ = stack.Close()
		cancel()
		<-done
	}
}

// receive returns the payloads of the next n messages of queue, sorted (handlers run
// concurrently, so they come in any order).
func receive(b *memory.Broker, queue string, n int) []string {
	sub := b.Subscriber(broker.SubscribeOptions{})
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), queue)
	if err != nil {
		panic(err)
	}
	var got []string
	for range n {
		m := <-msgs
		got = append(got, string(m.Payload))
		m.Ack()
	}
	slices.Sort(got)
	return got
}

// docs/migrating.md, "Using sluice in your own Watermill router": sluice's steps, in the
// stack's order, in a message.Router of your own.
func ownRouter(b *amqp.Broker, r *message.Router, retryCfg retry.Config, handle message.HandlerFunc) error {
	ctx := context.Background()
	if err := b.DeclareQueue(ctx, "payments.requested"); err != nil {
		return err
	}
	mws, closeSteps, err := router.Middlewares(b, router.Config{Retry: retryCfg, Idempotency: &idempotency.Config{}, Breaker: &breaker.Config{}})
	if err != nil {
		return err
	}
	defer closeSteps()      // after r.Close: closes the guard, unregisters gauges and listeners
	r.AddMiddleware(mws...) // first added is outermost
	r.AddHandler("payments", "payments.requested", b.Subscriber(broker.SubscribeOptions{Concurrency: 8, Prefetch: 16}),
		"payments.succeeded", b.Publisher(), handle)
	defer r.Close()
	return r.Run(ctx)
}

func ExampleMiddlewares_ownRouter() {
	broker, _ := connectForDocs()
	defer broker.Close()
	r, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	retryCfg := retry.Config{MaxRetries: 5, InitialDelay: time.Second}
	handle := func(msg *message.Message) ([]*message.Message, error) { return nil, nil }
	if err := ownRouter(broker, r, retryCfg, handle); err != nil {
		panic(err)
	}
}

// docs/concepts.md, "Publish/subscribe": a subscriber's queue bound to a topic exchange,
// its outputs published to another exchange.
func ExampleWithSubscription() {
	mem, stack := docsStack(router.Config{})
	defer mem.Close()
	checkOrder := func(msg *message.Message) ([]*message.Message, error) {
		out := message.NewMessage(watermill.NewUUID(), msg.Payload)
		out.Metadata.Set(router.RoutingKeyMetadata, "check.flagged")
		return []*message.Message{out}, nil
	}
	stack.HandleWithOutput("fraud", "fraud.order-checks", "", checkOrder,
		router.WithSubscription(router.Binding{Exchange: "orders", Kind: broker.Topic,
			Keys: []string{"order.created", "order.*.eu"}}),
		router.WithOutputExchange(router.Output{Exchange: "fraud", RoutingKey: "check.passed"}))
	// a message can choose its own key: out.Metadata.Set(router.RoutingKeyMetadata, "check.flagged")

	// Another service's queue, for fraud's flagged checks.
	ctx := context.Background()
	_ = mem.DeclareSubscription(ctx, "review.flagged", []router.Binding{{Exchange: "fraud", Keys: []string{"check.flagged"}}}, false)
	defer runForDocs(stack)()
	for key, payload := range map[string]string{"order.created": "order 1", "order.paid": "order 2", "order.shipped.eu": "order 3"} {
		_ = mem.PublishToExchange(ctx, "orders", key, message.NewMessage(watermill.NewUUID(), []byte(payload)))
	}
	fmt.Println("flagged:", receive(mem, "review.flagged", 2)) // order.paid matches no key
	// Output:
	// flagged: [order 1 order 3]
}

// docs/scaling.md, "Scaling out: partitioned queues": payments.requested consumed as eight
// key-partitioned queues.
func ExampleWithPartitions() {
	duplicates := make(chan string, 1)
	onDuplicate := func(_ *message.Message, key string) { duplicates <- key }
	broker, stack := docsStack(router.Config{Idempotency: &idempotency.Config{OnDuplicate: onDuplicate}})
	defer broker.Close()
	handler := example_payment.NewHandler(example_payment.NewGateway())
	stack.HandleWithOutput("payments", "payments.requested", "payments.succeeded", handler.Handle,
		router.WithIdempotencyKey(example_payment.KeyFunc), router.WithPartitions(8))

	defer runForDocs(stack)()
	// Producers publish to the partitions by the idempotency key: a payment's duplicate goes
	// to the same partition, whose consumer finds its key done.
	payment := []byte(`{"payment_id":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"EUR","source":"tok_visa"}`)
	ctx := context.Background()
	_ = broker.PublishPartitioned(ctx, "payments.requested", "pay_1", message.NewMessage(watermill.NewUUID(), payment))
	fmt.Println("succeeded:", receive(broker, "payments.succeeded", 1))
	_ = broker.PublishPartitioned(ctx, "payments.requested", "pay_1", message.NewMessage(watermill.NewUUID(), payment))
	fmt.Println("duplicate acked:", <-duplicates)
	// Output:
	// succeeded: [{"payment_id":"pay_1","order_id":"ord_1","amount_cents":1299,"currency":"EUR","charge_id":"ch_00000001","attempts":1}]
	// duplicate acked: pay_1
}

// ledgerDB stands for a database that writes many rows in one statement.
type ledgerDB struct {
	written chan string // the entries written, one per message
}

// InsertEntries writes one ledger entry per message and returns one error per message.
func (db ledgerDB) InsertEntries(ctx context.Context, msgs []*message.Message) []error {
	for _, m := range msgs {
		db.written <- string(m.Payload)
	}
	return make([]error, len(msgs))
}

// docs/scaling.md, "Batch handlers": up to 50 messages, or those that came within 100 ms
// of the first, written at once.
func ExampleStack_HandleBatch() {
	broker, stack := docsStack(router.Config{})
	defer broker.Close()
	db := ledgerDB{written: make(chan string, 3)}
	stack.HandleBatch("ledger", "payments.succeeded", func(ctx context.Context, msgs []*message.Message) []error {
		return db.InsertEntries(ctx, msgs) // one error per message
	}, router.WithBatch(50, 100*time.Millisecond))

	defer runForDocs(stack)()
	for _, p := range []string{"entry 1", "entry 2", "entry 3"} {
		_ = broker.Publish("payments.succeeded", message.NewMessage(watermill.NewUUID(), []byte(p)))
	}
	// However the three were batched, each was written once and acked.
	var entries []string
	for range 3 {
		entries = append(entries, <-db.written)
	}
	slices.Sort(entries)
	fmt.Println("written:", entries)
	// Output:
	// written: [entry 1 entry 2 entry 3]
}

// docs/scaling.md, "Scaling to zero": Run handles what the queue holds and returns nil once
// it has been empty and nothing in flight for StopWhenIdle, so the job or pod exits.
func ExampleConfig_stopWhenIdle() {
	cfg := router.Config{StopWhenIdle: 200 * time.Millisecond} // 30 * time.Second in a deployment
	broker, stack := docsStack(cfg)
	defer broker.Close()
	stack.Handle("payments", "payments.requested", func(m *message.Message) error {
		fmt.Println("handled:", string(m.Payload))
		return nil
	})
	if err := stack.Declare(context.Background()); err != nil {
		panic(err)
	}
	_ = broker.Publish("payments.requested", message.NewMessage(watermill.NewUUID(), []byte("pay_1")))
	err := stack.Run(context.Background()) // nil once idle: the job or pod exits
	fmt.Println("Run returned:", err)
	// Output:
	// handled: pay_1
	// Run returned: <nil>
}
