package amqp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/mask"
)

// closeTimeout bounds the connection.close handshake: a node that stopped reading the
// socket (blocked by an alarm, frozen, blackholed) never answers it.
const closeTimeout = 5 * time.Second

// heartbeat is the heartbeat interval sluice asks for (the node may lower it). amqp091
// sends heartbeats at half the interval and gives up on a connection that read nothing for
// three of those halves, so a blackholed connection or a frozen node is detected within
// 1.5*heartbeat: 15s by default (measured by the fault suite: 3.0s with a node's 2s).
const heartbeat = 10 * time.Second

// connection keeps one AMQP connection up, reconnecting and failing over between URLs.
// Users wait for it with get; a lost connection is replaced in the background.
type connection struct {
	name   string // connection_name shown by RabbitMQ
	urls   []string
	tls    *tls.Config
	frame  int // the frame_max asked for
	logger *slog.Logger
	maxGap time.Duration

	mu    sync.Mutex
	conn  *amqp.Connection
	ready chan struct{} // closed while conn is usable
	next  int           // index of the URL to try first
	// blocked is the reason RabbitMQ gave in connection.blocked, empty while unblocked.
	blocked string

	reconnects atomic.Int64 // connections re-established after a loss (observe.go)

	closing chan struct{}
	done    chan struct{}
}

func dialConnection(ctx context.Context, cfg Config, name string) (*connection, error) {
	c := &connection{
		name:    name,
		urls:    cfg.URLs,
		tls:     cfg.TLS,
		frame:   cfg.FrameMax,
		logger:  cfg.Logger,
		maxGap:  cfg.ReconnectMaxInterval,
		ready:   make(chan struct{}),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	// The first connection is made in the caller's goroutine so that a wrong URL or
	// password is an error from New, not a silent retry loop.
	conn, err := c.dialAny()
	if err != nil {
		return nil, err
	}
	c.setConn(conn)
	go c.watch(conn)
	return c, nil
}

func (c *connection) dialAny() (*amqp.Connection, error) {
	var errs []error
	for i := range c.urls {
		idx := (c.next + i) % len(c.urls)
		u := c.urls[idx]
		conn, err := c.dial(u)
		if err == nil {
			c.next = idx
			c.logger.Info("connected to RabbitMQ", "url", mask.URL(u), "connection", c.name)
			return conn, nil
		}
		errs = append(errs, fmt.Errorf("connect to %s: %w", mask.URL(u), maskErr(err, c.urls)))
	}
	return nil, errors.Join(errs...)
}

func (c *connection) dial(u string) (*amqp.Connection, error) {
	cfg := amqp.Config{
		// A node that drops packets instead of refusing them must not stall failover for
		// amqp091's default 30s per URL.
		Dial:       amqp.DefaultDial(10 * time.Second),
		Heartbeat:  heartbeat,
		Locale:     "en_US",
		Properties: amqp.Table{"connection_name": c.name},
		FrameSize:  c.frame,
	}
	if parsed, err := url.Parse(u); err == nil && parsed.Scheme == "amqps" {
		// amqp091 writes the URL's host into the ServerName of the config it is given
		// when that is empty. A clone per dial keeps the caller's config untouched (it
		// may be shared with other goroutines) and verifies each URL of a failover list
		// against its own host, not against the first one dialled.
		tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.tls != nil {
			tlsCfg = c.tls.Clone()
		}
		cfg.TLSClientConfig = tlsCfg
	}
	return amqp.DialConfig(u, cfg)
}

func (c *connection) setConn(conn *amqp.Connection) {
	c.mu.Lock()
	c.conn = conn
	c.blocked = ""
	close(c.ready)
	c.mu.Unlock()
	// amqp091 closes the channel when the connection ends, which ends the goroutine.
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go c.watchBlocked(conn, blocks)
}

// watchBlocked records connection.blocked and connection.unblocked of conn.
func (c *connection) watchBlocked(conn *amqp.Connection, blocks <-chan amqp.Blocking) {
	for b := range blocks {
		c.mu.Lock()
		current := c.conn == conn
		if current {
			c.blocked = ""
			if b.Active {
				c.blocked = b.Reason
				if c.blocked == "" {
					c.blocked = "no reason given"
				}
			}
		}
		c.mu.Unlock()
		if !current {
			continue
		}
		if b.Active {
			c.logger.Warn("RabbitMQ blocked the connection; publishes wait", "connection", c.name, "reason", b.Reason)
		} else {
			c.logger.Info("RabbitMQ unblocked the connection", "connection", c.name)
		}
	}
}

// blockedErr returns an error wrapping broker.ErrBlocked, with RabbitMQ's reason, while
// RabbitMQ blocks the connection (connection.blocked: a memory or disk alarm), else nil.
func (c *connection) blockedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.blocked == "" {
		return nil
	}
	return fmt.Errorf("%w: RabbitMQ blocked the connection: %s", broker.ErrBlocked, c.blocked)
}

// watch waits for the connection to drop, then reconnects with backoff until Close.
func (c *connection) watch(conn *amqp.Connection) {
	defer close(c.done)
	for {
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		select {
		case <-c.closing:
			return
		case amqpErr := <-closed:
			c.mu.Lock()
			c.conn = nil
			c.blocked = ""
			c.ready = make(chan struct{})
			c.mu.Unlock()
			c.logger.Warn("RabbitMQ connection lost; reconnecting", "error", maskErr(errorOrNil(amqpErr), c.urls), "connection", c.name)
			// The node just lost is the suspect one: a blackholed node still accepts TCP
			// and would hold the first attempt for the whole dial timeout.
			c.next = (c.next + 1) % len(c.urls)
		}
		bo := backoff.NewExponentialBackOff()
		bo.InitialInterval = 100 * time.Millisecond
		bo.MaxInterval = c.maxGap
		// Jitter spreads the reconnects of many services after a broker restart.
		bo.RandomizationFactor = 0.5
		bo.MaxElapsedTime = 0
		for {
			next, err := c.dialAny()
			if err == nil {
				conn = next
				c.setConn(conn)
				c.reconnects.Add(1)
				break
			}
			wait := bo.NextBackOff()
			c.logger.Warn("reconnect to RabbitMQ failed", "error", err, "retry_in", wait)
			t := time.NewTimer(wait)
			select {
			case <-c.closing:
				t.Stop()
				return
			case <-t.C:
			}
			// Fail over: start the next round at the following node.
			c.next = (c.next + 1) % len(c.urls)
		}
	}
}

func errorOrNil(e *amqp.Error) error {
	if e == nil {
		return errors.New("connection closed")
	}
	return e
}

// get returns the live connection, waiting for a reconnect within ctx.
func (c *connection) get(ctx context.Context) (*amqp.Connection, error) {
	for {
		c.mu.Lock()
		conn, ready := c.conn, c.ready
		c.mu.Unlock()
		if conn != nil && !conn.IsClosed() {
			return conn, nil
		}
		select {
		case <-c.closing:
			return nil, broker.ErrClosed
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for RabbitMQ connection: %w", ctx.Err())
		case <-ready:
		case <-time.After(50 * time.Millisecond):
			// conn was closed but watch has not noticed yet; look again shortly.
		}
	}
}

// current returns the live connection, or nil while there is none.
func (c *connection) current() *amqp.Connection {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}

// abandon closes conn, when it is still the live connection, because its node stopped
// confirming publishes (reason says how): watch then reconnects through the next URL, as
// after any loss, and what waited for a confirm on it is published again.
func (c *connection) abandon(conn *amqp.Connection, reason string) {
	c.mu.Lock()
	live := conn != nil && c.conn == conn
	c.mu.Unlock()
	if !live || c.isClosing() {
		return
	}
	c.logger.Warn("RabbitMQ node stopped confirming publishes; reconnecting through the next URL", "reason", reason, "connection", c.name)
	// The node still answers connection.close (it only lost its cluster); the deadline is
	// for one that does not.
	if err := conn.CloseDeadline(time.Now().Add(closeTimeout)); err != nil && !errors.Is(err, amqp.ErrClosed) {
		c.logger.Warn("close of the stalled connection failed; dropped it", "error", maskErr(err, c.urls), "connection", c.name)
	}
}

// frameMax is the frame_max negotiated with the live connection's node, or the one asked for
// while there is no connection (a node can only lower it).
func (c *connection) frameMax() int {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn != nil && conn.Config.FrameSize > 0 {
		return conn.Config.FrameSize
	}
	return c.frame
}

// channel opens a channel on the live connection, waiting for a reconnect within ctx.
func (c *connection) channel(ctx context.Context) (*amqp.Channel, error) {
	for {
		conn, err := c.get(ctx)
		if err != nil {
			return nil, err
		}
		ch, err := openChannel(ctx, conn)
		if err == nil {
			return ch, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("open channel: %w", errors.Join(ctx.Err(), c.blockedErr()))
		}
		if !errors.Is(err, amqp.ErrClosed) {
			return nil, fmt.Errorf("open channel: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("open channel: %w", ctx.Err())
		case <-c.closing:
			return nil, broker.ErrClosed
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// openChannel opens a channel on conn within ctx. channel.open has no deadline of its own in
// amqp091, and a node that stopped reading the socket (alarm, freeze) never answers it; a
// channel that opens after ctx ended is closed again.
func openChannel(ctx context.Context, conn *amqp.Connection) (*amqp.Channel, error) {
	type result struct {
		ch  *amqp.Channel
		err error
	}
	res := make(chan result, 1)
	go func() {
		ch, err := conn.Channel()
		res <- result{ch, err}
	}()
	select {
	case r := <-res:
		return r.ch, r.err
	case <-ctx.Done():
		go func() {
			if r := <-res; r.ch != nil {
				_ = r.ch.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

func (c *connection) isClosing() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

func (c *connection) close() error {
	select {
	case <-c.closing:
		return nil
	default:
	}
	close(c.closing)
	c.mu.Lock()
	conn, blocked := c.conn, c.blocked
	c.mu.Unlock()
	var err error
	if conn != nil && !conn.IsClosed() {
		// A blocked connection is not read by the node until the alarm clears: it will
		// not answer connection.close, so the socket is dropped at once.
		deadline := time.Now().Add(closeTimeout)
		if blocked != "" {
			deadline = time.Now().Add(100 * time.Millisecond)
		}
		err = conn.CloseDeadline(deadline)
	}
	<-c.done
	// Unanswered by a blocked node, the close is still done: the socket is gone.
	if errors.Is(err, amqp.ErrClosed) || blocked != "" {
		err = nil
	}
	return err
}
