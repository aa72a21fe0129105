package dlq

import (
	"context"
	"errors"

	amqp "github.com/rabbitmq/amqp091-go"
)

// purgeQueue deletes every ready message of queue's DLQ and returns how many it deleted (see
// Operator.Purge for selected messages). An empty DLQ is not an error here.
func purgeQueue(ctx context.Context, conn *amqp.Connection, queue string) (int, error) {
	res, err := Operator{Conn: conn}.Purge(ctx, queue, Selector{All: true}, Options{})
	if errors.Is(err, ErrNothingSelected) {
		err = nil
	}
	return res.Moved, err
}
