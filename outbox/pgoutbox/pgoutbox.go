// Package pgoutbox is the PostgreSQL outbox: Watermill's SQL forwarder, for several
// producer instances or for messages written in the same transaction as the
// application's own data. Producers publish into a table, and one forwarder moves the
// rows to RabbitMQ with confirms, deleting each row after its confirm. It lives apart from
// package outbox (the file outbox) so that a program using only the file outbox compiles
// neither watermill-sql nor a PostgreSQL driver. Package outbox's documentation says what
// "exactly once" means for both.
package pgoutbox

import (
	"context"
	stdsql "database/sql"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice"
)

// Config configures an Outbox. The zero value is usable.
type Config struct {
	// Topic names the outbox: its table is "watermill_<Topic>". Zero means
	// "sluice_outbox". Letters, digits and underscores only.
	Topic string
	// PollInterval is how often the forwarder looks for new rows when the table was
	// empty. Zero means 100ms.
	PollInterval time.Duration
	// ResendInterval is the wait before a row whose publish failed is tried again. Zero
	// means 500ms.
	ResendInterval time.Duration
	// ForwardTimeout bounds one forwarded message's publish, confirm included. Zero means
	// 10s.
	ForwardTimeout time.Duration
	// Logger receives Watermill's logs. Nil means slog.Default() through Watermill's
	// slog adapter.
	Logger watermill.LoggerAdapter
}

var topicPattern = regexp.MustCompile(`^[A-Za-z0-9_]+$`)

// validate fills in the defaults and checks the values.
func (c *Config) validate() error {
	if c.Topic == "" {
		c.Topic = "sluice_outbox"
	}
	if !topicPattern.MatchString(c.Topic) {
		return fmt.Errorf("pgoutbox: topic %q: want letters, digits and underscores", c.Topic)
	}
	if c.PollInterval <= 0 {
		c.PollInterval = 100 * time.Millisecond
	}
	if c.ResendInterval <= 0 {
		c.ResendInterval = 500 * time.Millisecond
	}
	if c.ForwardTimeout <= 0 {
		c.ForwardTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = watermill.NewSlogLogger(slog.Default())
	}
	return nil
}

// Outbox is Watermill's SQL forwarder on PostgreSQL: producers publish into an
// outbox table (in their own transaction, with their own data, through Publisher), and
// Run moves the rows to RabbitMQ in order, deleting each row once the broker confirmed
// it. Any number of producer instances may share the table; run one forwarder per table
// where order matters (the rows are taken oldest first under a row lock). Forwarding is
// at-least-once, each copy with the message's UUID as its message id (Watermill's
// envelope carries it), for the consumer's idempotency step to recognise.
type Outbox struct {
	db  *stdsql.DB
	cfg Config
	sub *wsql.Subscriber
	fwd *forwarder.Forwarder
}

// New creates the outbox table in db if missing and a forwarder that
// publishes its rows through out (a confirmed publisher). Start it with Run.
func New(db *stdsql.DB, out message.Publisher, cfg Config) (*Outbox, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ackDeadline := 2*cfg.ForwardTimeout + time.Minute
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		SchemaAdapter:    wsql.PostgreSQLQueueSchema{},
		OffsetsAdapter:   wsql.PostgreSQLQueueOffsetsAdapter{DeleteOnAck: true},
		InitializeSchema: true,
		PollInterval:     cfg.PollInterval,
		ResendInterval:   cfg.ResendInterval,
		RetryInterval:    cfg.ResendInterval,
		AckDeadline:      &ackDeadline,
	}, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: PostgreSQL subscriber: %w", err)
	}
	if err := sub.SubscribeInitialize(cfg.Topic); err != nil {
		_ = sub.Close()
		return nil, fmt.Errorf("pgoutbox: create the outbox table for %q: %w", cfg.Topic, err)
	}
	fwd, err := forwarder.NewForwarder(sub, timeoutPublisher{out, cfg.ForwardTimeout}, cfg.Logger, forwarder.Config{
		ForwarderTopic: cfg.Topic,
		CloseTimeout:   cfg.ForwardTimeout + time.Second,
	})
	if err != nil {
		_ = sub.Close()
		return nil, fmt.Errorf("pgoutbox: Watermill forwarder: %w", err)
	}
	return &Outbox{db: db, cfg: cfg, sub: sub, fwd: fwd}, nil
}

// Publisher returns a publisher that writes messages into the outbox table through exec:
// a *sql.Tx (wrapped with TxFromStdSQL) makes them part of the application's transaction,
// so they reach RabbitMQ if and only if it commits. The topic given to Publish is where
// the forwarder publishes them.
func (o *Outbox) Publisher(exec wsql.ContextExecutor) (message.Publisher, error) {
	pub, err := wsql.NewPublisher(exec, wsql.PublisherConfig{SchemaAdapter: wsql.PostgreSQLQueueSchema{}}, o.cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: PostgreSQL publisher: %w", err)
	}
	return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: o.cfg.Topic}), nil
}

// DBPublisher is Publisher outside any transaction: each Publish is its own insert.
func (o *Outbox) DBPublisher() (message.Publisher, error) {
	return o.Publisher(wsql.BeginnerFromStdSQL(o.db))
}

// Run forwards rows until ctx ends or Close.
func (o *Outbox) Run(ctx context.Context) error { return o.fwd.Run(ctx) }

// Running is closed once the forwarder runs: wait for it before Close when Run was
// started in a goroutine, as with Watermill's Forwarder.
func (o *Outbox) Running() chan struct{} { return o.fwd.Running() }

// Pending counts the rows not yet forwarded.
func (o *Outbox) Pending(ctx context.Context) (int, error) {
	var n int
	table := wsql.PostgreSQLQueueSchema{}.MessagesTable(o.cfg.Topic)
	if err := o.db.QueryRowContext(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		return 0, fmt.Errorf("pgoutbox: count rows of %s: %w", table, err)
	}
	return n, nil
}

// Close stops the forwarder; rows not yet forwarded stay in the table.
func (o *Outbox) Close() error {
	err := o.fwd.Close()
	if cerr := o.sub.Close(); err == nil {
		err = cerr
	}
	return err
}

// timeoutPublisher bounds each of the forwarder's publishes: an unwrapped message has no
// deadline of its own.
type timeoutPublisher struct {
	pub     message.Publisher
	timeout time.Duration
}

func (p timeoutPublisher) Publish(topic string, messages ...*message.Message) error {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	return sluice.PublishContext(ctx, p.pub, topic, messages...)
}

func (p timeoutPublisher) Close() error { return nil }
