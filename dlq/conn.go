package dlq

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/internal/mask"
	"github.com/sluice-go/sluice/internal/topology"
)

// Errors a caller tells apart (the CLI maps them to exit codes).
var (
	// ErrQueueNotFound means the DLQ Q.dlq does not exist: Q does not use sluice's
	// topology, or the name is wrong.
	ErrQueueNotFound = errors.New("queue not found")
	// ErrMessageNotFound means no message in the DLQ has the id asked for.
	ErrMessageNotFound = errors.New("message not found")
	// ErrDestinationNotFound means a message's original queue does not exist, so it was
	// not replayed and stays in the DLQ.
	ErrDestinationNotFound = errors.New("destination queue not found")
	// ErrNoSelector is returned by Replay when the Selector selects nothing explicitly.
	ErrNoSelector = errors.New("no selector: give ids, an error type, an age or All")
	// ErrNoConnection is returned when an Inspector or Replayer has no connection.
	ErrNoConnection = errors.New("dlq: no RabbitMQ connection")
)

// DLQName returns the dead-letter queue of queue (broker/amqp's naming).
func DLQName(queue string) string { return topology.DLQ(queue) }

// ArchiveName returns the archive of queue's dead letters (broker/amqp's naming).
func ArchiveName(queue string) string { return topology.Archive(queue) }

// DialTimeout bounds the TCP and AMQP handshake of Dial.
const DialTimeout = 10 * time.Second

// Dial connects to the first reachable of urls. Errors name the URL with its password
// masked (internal/mask.URL) and never contain the password.
func Dial(urls ...string) (*amqp.Connection, error) {
	if len(urls) == 0 {
		return nil, errors.New("dlq: no RabbitMQ URL given")
	}
	var errs []error
	for _, u := range urls {
		cfg := amqp.Config{
			Dial:       amqp.DefaultDial(DialTimeout),
			Heartbeat:  10 * time.Second,
			Properties: amqp.Table{"connection_name": "sluice dlq"},
		}
		conn, err := amqp.DialConfig(u, cfg)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, MaskError(fmt.Errorf("connect to RabbitMQ at %s: %w", mask.URL(u), err), urls...))
	}
	return nil, errors.Join(errs...)
}

// MaskError returns err with every password of urls, and every URL, masked in its text.
// An error whose text holds no secret is returned as it is, so errors.Is still works; a
// masked one keeps the sentinel errors of this package it wrapped.
func MaskError(err error, urls ...string) error {
	if err == nil {
		return nil
	}
	text := err.Error()
	masked := mask.Text(text, urls...)
	if masked == text {
		return err
	}
	return &maskedError{text: masked, err: err}
}

// maskedError is an error whose text had a secret removed. It unwraps only to the
// sentinels of this package, never to the original (whose text holds the secret).
type maskedError struct {
	text string
	err  error
}

func (e *maskedError) Error() string { return e.text }

func (e *maskedError) Is(target error) bool {
	switch target {
	case ErrQueueNotFound, ErrMessageNotFound, ErrDestinationNotFound, ErrNoSelector:
		return errors.Is(e.err, target)
	}
	return false
}

// isNotFound reports whether err is RabbitMQ's 404 NOT_FOUND channel error.
func isNotFound(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.NotFound
}

// Source is the queue of Q's dead letters an operation works on: the DLQ (the zero value)
// or the archive.
type Source int

const (
	// FromDLQ is Q.dlq.
	FromDLQ Source = iota
	// FromArchive is Q.dlq.archive (see Operator.Archive).
	FromArchive
)

// Name returns the name of queue's source queue.
func (s Source) Name(queue string) string {
	if s == FromArchive {
		return ArchiveName(queue)
	}
	return DLQName(queue)
}

// String returns "dlq" or "archive".
func (s Source) String() string {
	if s == FromArchive {
		return "archive"
	}
	return "dlq"
}

// openDLQ opens a channel and checks that queue's DLQ exists, returning its ready count.
func openDLQ(conn *amqp.Connection, queue string) (*amqp.Channel, int, error) {
	return openSource(conn, queue, FromDLQ)
}

// openSource opens a channel and checks that queue's source queue exists, returning its
// ready count.
func openSource(conn *amqp.Connection, queue string, src Source) (*amqp.Channel, int, error) {
	if conn == nil {
		return nil, 0, ErrNoConnection
	}
	if queue == "" {
		return nil, 0, errors.New("dlq: empty queue name")
	}
	name := src.Name(queue)
	ch, err := conn.Channel()
	if err != nil {
		return nil, 0, fmt.Errorf("open channel: %w", err)
	}
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		if isNotFound(err) {
			kind := "dead-letter queue"
			if src == FromArchive {
				kind = "archive"
			}
			return nil, 0, fmt.Errorf("%s %q of queue %q: %w", kind, name, queue, ErrQueueNotFound)
		}
		return nil, 0, fmt.Errorf("check %q: %w", name, err)
	}
	return ch, q.Messages, nil
}
