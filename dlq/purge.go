package dlq

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Purge deletes every ready message of queue's DLQ and returns how many it deleted.
// Messages another client holds unacknowledged at that moment are not ready and survive.
func Purge(ctx context.Context, conn *amqp.Connection, queue string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	ch, _, err := openDLQ(conn, queue)
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	n, err := ch.QueuePurge(DLQName(queue), false)
	if err != nil {
		return 0, fmt.Errorf("purge %q: %w", DLQName(queue), err)
	}
	return n, nil
}
