package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/memory"
)

// A subscriber (or broker) closing while a handler holds a message gives the handler
// DrainTimeout to decide; a message still undecided then goes back to its queue and its
// context is cancelled. Close used to wait for that verdict forever.
func TestCloseWithUndecidedMessage(t *testing.T) {
	cases := []struct {
		name  string
		close func(b *memory.Broker, sub message.Subscriber) error
	}{
		{"subscriber closes", func(_ *memory.Broker, sub message.Subscriber) error { return sub.Close() }},
		{"broker closes", func(b *memory.Broker, sub message.Subscriber) error {
			if err := b.Close(); err != nil {
				return err
			}
			return sub.Close()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := memory.New(memory.Config{DrainTimeout: 200 * time.Millisecond})
			t.Cleanup(func() { _ = b.Close() })
			require.NoError(t, b.Publish("q", message.NewMessage("m1", []byte("x"))))
			sub := b.Subscriber(broker.SubscribeOptions{})
			msgs, err := sub.Subscribe(context.Background(), "q")
			require.NoError(t, err)
			var held *message.Message
			select {
			case held = <-msgs:
			case <-time.After(5 * time.Second):
				t.Fatal("message not delivered")
			}

			closed := make(chan error, 1)
			go func() { closed <- tc.close(b, sub) }()
			select {
			case err := <-closed:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("Close did not return while a handler held a message")
			}
			select {
			case <-held.Context().Done():
			default:
				t.Fatal("the held message's context must be cancelled once the drain ran out")
			}
			assert.Equal(t, 1, b.Len("q"), "the undecided message must be back in its queue")
		})
	}
}

// A handler that decides within DrainTimeout is waited for: its ack counts and the message
// does not come back.
func TestCloseWaitsForHandlerWithinDrainTimeout(t *testing.T) {
	b := memory.New(memory.Config{DrainTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = b.Close() })
	require.NoError(t, b.Publish("q", message.NewMessage("m1", []byte("x"))))
	sub := b.Subscriber(broker.SubscribeOptions{})
	msgs, err := sub.Subscribe(context.Background(), "q")
	require.NoError(t, err)
	held := <-msgs

	closed := make(chan error, 1)
	go func() { closed <- sub.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned while the handler still held the message")
	case <-time.After(100 * time.Millisecond):
	}
	held.Ack()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return after the ack")
	}
	assert.Equal(t, 0, b.Len("q"), "an acked message must not come back")
}
