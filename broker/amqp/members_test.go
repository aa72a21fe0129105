package amqp_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/membership"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

func TestJoin_RefusesBadConfig(t *testing.T) {
	b := newBroker(t, amqp.Config{})
	for _, cfg := range []broker.MembershipConfig{
		{Interval: -time.Second},
		{Interval: time.Second, Expiry: time.Second},
	} {
		_, err := b.Join(context.Background(), "q", cfg)
		assert.ErrorIs(t, err, membership.ErrInvalid, "config %+v", cfg)
	}
}

// Instances of one queue learn of each other through RabbitMQ: a joiner is listed by all
// within a heartbeat, a graceful leaver at once, a killed one (its connection closed, no
// goodbye) within the expiry.
func TestMembership_JoinLeaveKill(t *testing.T) {
	const interval, expiry = 100 * time.Millisecond, 400 * time.Millisecond
	queue := testenv.Name("test.members")
	join := func(id string) (*amqp.Broker, broker.Membership) {
		b := newBroker(t, amqp.Config{})
		m, err := b.Join(context.Background(), queue, broker.MembershipConfig{ID: id, Interval: interval, Expiry: expiry})
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Close() })
		return b, m
	}
	converged := func(want []string, ms ...broker.Membership) func() bool {
		return func() bool {
			for _, m := range ms {
				if !slices.Equal(m.Members(), want) {
					return false
				}
			}
			return true
		}
	}

	_, a := join("a")
	assert.Equal(t, []string{"a"}, a.Members())
	changed := a.Changed()
	start := time.Now()
	_, b := join("b")
	bKill, c := join("c")
	require.Eventually(t, converged([]string{"a", "b", "c"}, a, b, c), 5*time.Second, 10*time.Millisecond)
	t.Logf("joins seen by all after %s", time.Since(start))
	select {
	case <-changed:
	default:
		t.Error("Changed was not closed by a join")
	}

	start = time.Now()
	require.NoError(t, b.Close())
	require.Eventually(t, converged([]string{"a", "c"}, a, c), interval, 5*time.Millisecond, "a goodbye takes effect at once")
	t.Logf("graceful leave seen after %s", time.Since(start))

	start = time.Now()
	require.NoError(t, bKill.Close()) // c's connection goes; c says no goodbye
	require.Eventually(t, converged([]string{"a"}, a), expiry+2*interval, 10*time.Millisecond, "a killed member expires")
	took := time.Since(start)
	assert.GreaterOrEqual(t, took, expiry-2*interval, "a killed member is not dropped before its heartbeats stop counting")
	t.Logf("kill seen after %s (expiry %s)", took, expiry)
}
