package dlq

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/dlqwire"
	"github.com/sluice-go/sluice/internal/topology"
)

// Errors a caller tells apart (the CLI maps them to exit codes).
var (
	// ErrMessageNotFound means no message in the DLQ has the id asked for.
	ErrMessageNotFound = dlqwire.ErrMessageNotFound
	// ErrDestinationNotFound means a message's original queue does not exist, so it was
	// not replayed and stays in the DLQ.
	ErrDestinationNotFound = dlqwire.ErrDestinationNotFound
	// ErrNoSelector is returned by Replay when the Selector selects nothing explicitly.
	ErrNoSelector = dlqwire.ErrNoSelector
)

// errNoConnection is returned by an Inspector or Operator without a Conn, and by
// ListUnrouted and ReadAudit given none.
var errNoConnection = errors.New("dlq: no RabbitMQ connection (Inspector.Conn, Operator.Conn)")

// dlqName returns the dead-letter queue of queue (broker/amqp's naming).
func dlqName(queue string) string { return topology.DLQ(queue) }

// archiveName returns the archive of queue's dead letters (broker/amqp's naming).
func archiveName(queue string) string { return topology.Archive(queue) }

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

// name returns the name of queue's source queue: Q.dlq or Q.dlq.archive.
func (s Source) name(queue string) string {
	if s == FromArchive {
		return archiveName(queue)
	}
	return dlqName(queue)
}

// String returns "dlq" or "archive".
func (s Source) String() string {
	if s == FromArchive {
		return "archive"
	}
	return "dlq"
}

// openSource opens a channel and checks that queue's source queue exists, returning its
// ready count.
func openSource(conn *amqp.Connection, queue string, src Source) (*amqp.Channel, int, error) {
	if conn == nil {
		return nil, 0, errNoConnection
	}
	if queue == "" {
		return nil, 0, errors.New("dlq: empty queue name")
	}
	name := src.name(queue)
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
			return nil, 0, fmt.Errorf("%s %q of queue %q: %w", kind, name, queue, sluice.ErrQueueNotFound)
		}
		return nil, 0, fmt.Errorf("check %q: %w", name, err)
	}
	return ch, q.Messages, nil
}
