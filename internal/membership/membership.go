// Package membership is how the instances of one partitioned handler learn of each other
// through RabbitMQ alone, for router's rebalancing (router.WithRebalancing); package
// broker/amqp opens it on its connection with Broker.Join. Moved from broker/amqp, where
// its names were Membership, MembershipConfig, ErrInvalidMembership and
// DefaultHeartbeatInterval.
package membership

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/topology"
)

// ErrInvalid is returned by Join for a Config out of range.
var ErrInvalid = errors.New("amqp: invalid membership config")

// Membership defaults.
const (
	// DefaultInterval is Config.Interval's zero value.
	DefaultInterval = 500 * time.Millisecond
	// defaultMemberExpiry is Config.Expiry's zero value, in intervals.
	defaultMemberExpiry = 3
)

// Config configures Join: package broker's MembershipConfig, which Broker.Join takes.
type Config = broker.MembershipConfig

func setDefaults(c *Config) error {
	if c.ID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		c.ID = hex.EncodeToString(b[:])
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Expiry == 0 {
		c.Expiry = defaultMemberExpiry * c.Interval
	}
	if c.Interval < 0 || c.Expiry <= c.Interval {
		return fmt.Errorf("%w: Interval %s, Expiry %s (Interval must be positive and below Expiry)", ErrInvalid, c.Interval, c.Expiry)
	}
	return nil
}

// Membership is this instance's place among the instances of one partitioned handler,
// learnt through RabbitMQ alone, as amqp.Broker.Join (its only caller) tells.
type Membership struct {
	open   Opener
	closed error
	queue  string
	cfg    Config

	mu      sync.Mutex
	seen    map[string]time.Time
	changed chan struct{} // closed and replaced when the list may have changed

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// Opener opens a channel on a broker's connection. An error that matches the closed
// sentinel given to Join means the broker was closed for good.
type Opener func(ctx context.Context) (*amqp.Channel, error)

// Join starts announcing this instance among queue's members and listening to the others,
// on channels from open; an error matching closed stops the reopening after a connection
// loss. It returns once the listening queue is bound, so the first heartbeats are heard.
func Join(ctx context.Context, open Opener, closed error, queue string, cfg Config) (*Membership, error) {
	if err := setDefaults(&cfg); err != nil {
		return nil, err
	}
	m := &Membership{open: open, closed: closed, queue: queue, cfg: cfg, seen: map[string]time.Time{}, changed: make(chan struct{}),
		stop: make(chan struct{}), done: make(chan struct{})}
	ch, deliveries, err := m.listen(ctx)
	if err != nil {
		return nil, err
	}
	go m.run(ch, deliveries)
	return m, nil
}

// ID is this instance's member id.
func (m *Membership) ID() string { return m.cfg.ID }

// Members returns the live members' ids, sorted, this instance included.
func (m *Membership) Members() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	ids := make([]string, 0, len(m.seen)+1)
	ids = append(ids, m.cfg.ID)
	for id, at := range m.seen {
		if id != m.cfg.ID && now.Sub(at) < m.cfg.Expiry {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Changed is closed when a member joined or left (or may have, by expiry); call it again
// for the next change.
func (m *Membership) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// Close says goodbye (best effort) and stops; it waits for the heartbeat loop.
func (m *Membership) Close() error {
	m.stopOnce.Do(func() { close(m.stop) })
	<-m.done
	return nil
}

const (
	memberHeaderKind = "x-sluice-member"
	memberHello      = "hello"
	memberBye        = "bye"
	memberBroadcast  = "broadcast"
	memberHeaderFrom = "x-sluice-member-from"
)

// Broadcast publishes body to every other member's OnBroadcast, confirmed; members that
// join later do not get it.
func (m *Membership) Broadcast(ctx context.Context, body []byte) error {
	ch, err := m.open(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("broadcast to %q: confirm mode: %w", topology.Members(m.queue), err)
	}
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, topology.Members(m.queue), "", false, false, amqp.Publishing{
		Headers: amqp.Table{memberHeaderKind: memberBroadcast, memberHeaderFrom: m.cfg.ID},
		Body:    body,
	})
	if err != nil {
		return fmt.Errorf("broadcast %d bytes to %q: %w", len(body), topology.Members(m.queue), err)
	}
	ok, err := conf.WaitContext(ctx)
	if err != nil || !ok {
		return fmt.Errorf("broadcast %d bytes to %q: not confirmed: %v", len(body), topology.Members(m.queue), err)
	}
	return nil
}

// listen opens a channel with this instance's queue bound to the members exchange.
func (m *Membership) listen(ctx context.Context) (*amqp.Channel, <-chan amqp.Delivery, error) {
	ch, err := m.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	ex := topology.Members(m.queue)
	if err := ch.ExchangeDeclare(ex, amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
		return nil, nil, fmt.Errorf("declare members exchange %q: %w", ex, err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, amqp.Table{"x-message-ttl": int32(m.cfg.Expiry / time.Millisecond)})
	if err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("declare member queue of %q: %w", ex, err)
	}
	if err := ch.QueueBind(q.Name, "", ex, false, nil); err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("bind member queue to %q: %w", ex, err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("consume member queue of %q: %w", ex, err)
	}
	return ch, deliveries, nil
}

// run announces and listens until Close; a lost channel (connection loss) is reopened.
func (m *Membership) run(ch *amqp.Channel, deliveries <-chan amqp.Delivery) {
	defer close(m.done)
	tick := time.NewTicker(m.cfg.Interval)
	defer tick.Stop()
	m.announce(ch, memberHello)
	for {
		select {
		case <-m.stop:
			if ch != nil {
				m.announce(ch, memberBye)
				_ = ch.Close()
			}
			return
		case d, ok := <-deliveries:
			if !ok {
				ch, deliveries = m.reopen()
				continue
			}
			m.heard(d)
		case <-tick.C:
			if ch != nil {
				m.announce(ch, memberHello)
			}
			m.expire()
		}
	}
}

// reopen waits for a channel on a repaired connection; until then nothing is heard, and
// the others expire this instance.
func (m *Membership) reopen() (*amqp.Channel, <-chan amqp.Delivery) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Interval)
		ch, deliveries, err := m.listen(ctx)
		cancel()
		if err == nil {
			return ch, deliveries
		}
		if m.closed != nil && errors.Is(err, m.closed) {
			return nil, nil // the broker is closed: wait for Close, hearing nothing
		}
		select {
		case <-m.stop:
			return nil, nil
		case <-time.After(m.cfg.Interval):
		}
	}
}

func (m *Membership) announce(ch *amqp.Channel, kind string) {
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Interval)
	defer cancel()
	// Unconfirmed on purpose: a lost heartbeat is replaced by the next one.
	_ = ch.PublishWithContext(ctx, topology.Members(m.queue), "", false, false, amqp.Publishing{
		Headers:    amqp.Table{memberHeaderKind: kind},
		Body:       []byte(m.cfg.ID),
		Expiration: strconv.FormatInt(m.cfg.Expiry.Milliseconds(), 10),
	})
}

// heard records a heartbeat or a goodbye.
func (m *Membership) heard(d amqp.Delivery) {
	kind, _ := d.Headers[memberHeaderKind].(string)
	if kind == memberBroadcast {
		from, _ := d.Headers[memberHeaderFrom].(string)
		if from != m.cfg.ID && m.cfg.OnBroadcast != nil {
			m.cfg.OnBroadcast(from, d.Body)
		}
		return
	}
	id := string(d.Body)
	if id == "" || id == m.cfg.ID {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, known := m.seen[id]
	switch kind {
	case memberBye:
		delete(m.seen, id)
		if known {
			m.notify()
		}
	case memberHello:
		m.seen[id] = time.Now()
		if !known {
			m.notify()
		}
	}
}

// expire drops the members not heard within Expiry.
func (m *Membership) expire() {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	for id, at := range m.seen {
		if now.Sub(at) >= m.cfg.Expiry {
			delete(m.seen, id)
			m.notify()
		}
	}
}

// notify wakes Changed's waiters; m.mu is held.
func (m *Membership) notify() {
	close(m.changed)
	m.changed = make(chan struct{})
}
