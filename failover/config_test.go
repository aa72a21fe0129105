package failover_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/failover"
)

func TestConfig_Defaults(t *testing.T) {
	tests := []struct {
		name string
		cfg  failover.Config
		err  bool
	}{
		{"zero value", failover.Config{}, false},
		{"negative timeout", failover.Config{PrimaryTimeout: -time.Second}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := failover.Validate(&tt.cfg)
			if tt.err {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, 2*time.Second, tt.cfg.PrimaryTimeout)
			require.True(t, tt.cfg.Permanent(amqp.ErrUnroutable))
			require.False(t, tt.cfg.Permanent(errors.New("connection refused")))
		})
	}
}

// recorder is an in-memory publisher for the switching rules alone (the clusters
// themselves are TestFailover's).
type recorder struct {
	fail bool
	got  int
}

func (r *recorder) Publish(string, ...*message.Message) error {
	if r.fail {
		return errors.New("unreachable")
	}
	r.got++
	return nil
}
func (r *recorder) Close() error { return nil }

func TestPublisher_BlockedPrimaryIsRetriedEveryInterval(t *testing.T) {
	primary, secondary := &recorder{fail: true}, &recorder{}
	up := true
	pub, err := failover.NewPublisher(primary, secondary, failover.Config{
		PrimaryUp: func() bool { return up }, RetryPrimaryEvery: time.Hour, Logger: quietLogger(),
	})
	require.NoError(t, err)
	for i := 0; i < 5; i++ {
		require.NoError(t, pub.Publish("q", message.NewMessage("m", nil)))
	}
	require.Equal(t, 5, secondary.got)
	require.True(t, pub.OnSecondary())

	// The primary goes away and comes back: it is tried at once, whatever the interval.
	primary.fail = false
	up = false
	require.NoError(t, pub.Publish("q", message.NewMessage("m", nil)))
	require.Equal(t, 6, secondary.got)
	up = true
	require.NoError(t, pub.Publish("q", message.NewMessage("m", nil)))
	require.Equal(t, 1, primary.got)
	require.False(t, pub.OnSecondary())
}

func TestDial_UnreachableClusterIsNotConnectedAndCloses(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	// Port 1 on the loopback refuses at once: the cluster keeps trying in the background.
	c, err := failover.Dial(failover.ClusterConfig{
		AMQP:             amqp.Config{URLs: []string{"amqp://guest:guest@127.0.0.1:1/"}, Logger: quietLogger()},
		RetryMaxInterval: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	pub := c.Publisher()
	// failover.Publisher reads this method (Config.PrimaryUp) from the publisher it is given.
	require.False(t, pub.(interface{ Connected() bool }).Connected())
	err = pub.Publish("q", message.NewMessage("m", nil))
	require.ErrorIs(t, err, failover.ErrNotConnected)
	require.Nil(t, c.Broker())
	select {
	case <-c.Ready():
		t.Fatal("ready without a connection")
	default:
	}
	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "a second Close")
}

func TestDial_RejectsNegativeDurations(t *testing.T) {
	_, err := failover.Dial(failover.ClusterConfig{ConnectTimeout: -time.Second})
	require.Error(t, err)
}
