package sluice_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
)

type publishCtxKey struct{}

// plainPublisher is a Watermill publisher without PublishContext: it records the context
// of each message it is given.
type plainPublisher struct{ got []*message.Message }

func (p *plainPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.got = append(p.got, msgs...)
	return nil
}
func (p *plainPublisher) Close() error { return nil }

// contextPublisher records the context PublishContext was given.
type contextPublisher struct {
	plainPublisher
	ctx context.Context
}

func (p *contextPublisher) PublishContext(ctx context.Context, _ string, msgs ...*message.Message) error {
	p.ctx = ctx
	p.got = append(p.got, msgs...)
	return nil
}

func TestPublishContext(t *testing.T) {
	ctx := context.WithValue(context.Background(), publishCtxKey{}, "caller")
	t.Run("context publisher gets the context and the messages themselves", func(t *testing.T) {
		pub := &contextPublisher{}
		msg := message.NewMessage("1", []byte("x"))
		require.NoError(t, sluice.PublishContext(ctx, pub, "q", msg))
		assert.Same(t, ctx, pub.ctx)
		require.Len(t, pub.got, 1)
		assert.Same(t, msg, pub.got[0])
	})
	t.Run("plain publisher gets copies carrying the context", func(t *testing.T) {
		pub := &plainPublisher{}
		msg := message.NewMessage("1", []byte("x"))
		msg.Metadata.Set("k", "v")
		require.NoError(t, sluice.PublishContext(ctx, pub, "q", msg))
		require.Len(t, pub.got, 1)
		assert.NotSame(t, msg, pub.got[0], "the caller's message keeps its own context")
		assert.Equal(t, "caller", pub.got[0].Context().Value(publishCtxKey{}))
		assert.Nil(t, msg.Context().Value(publishCtxKey{}))
		assert.Equal(t, msg.UUID, pub.got[0].UUID)
		assert.Equal(t, "v", pub.got[0].Metadata.Get("k"))
	})
}
