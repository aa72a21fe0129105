package main

import (
	"time"

	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/middleware/retry"
)

func TestLoadConfigPartitionsAndQueueType(t *testing.T) {
	cases := []struct {
		name          string
		partitions    string
		queueType     string
		wantParts     int
		wantQueueType string
		wantErr       string
	}{
		{name: "defaults: plain queue, broker's queue type"},
		{name: "partitioned on quorum queues", partitions: "4", queueType: "quorum", wantParts: 4, wantQueueType: "quorum"},
		{name: "classic", queueType: "classic", wantQueueType: "classic"},
		{name: "negative partitions", partitions: "-1", wantErr: "PAYMENTS_PARTITIONS"},
		{name: "not a number", partitions: "four", wantErr: "PAYMENTS_PARTITIONS"},
		{name: "unknown queue type", queueType: "stream", wantErr: `AMQP_QUEUE_TYPE="stream"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PAYMENTS_PARTITIONS", tc.partitions)
			t.Setenv("AMQP_QUEUE_TYPE", tc.queueType)
			cfg, err := loadConfig()
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantParts, cfg.partitions)
			assert.Equal(t, tc.wantQueueType, cfg.queueType)
		})
	}
}

func TestLoadConfigIdempotencyMaxKeys(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        int
		wantErr     bool
	}{
		{name: "unset: the store's default", value: "", want: 0},
		{name: "a bound", value: "50000", want: 50000},
		{name: "negative", value: "-5", wantErr: true},
		{name: "not a number", value: "lots", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("IDEMPOTENCY_MAX_KEYS", tc.value)
			cfg, err := loadConfig()
			if tc.wantErr {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "IDEMPOTENCY_MAX_KEYS")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, cfg.maxKeys)
		})
	}
}

func TestLoadConfigRetryJitter(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        float64
	}{
		{name: "unset: 0.1", value: "", want: 0.1},
		{name: "0 means none", value: "0", want: retry.NoJitter},
		{name: "a factor", value: "0.3", want: 0.3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("RETRY_JITTER", tc.value)
			cfg, err := loadConfig()
			require.NoError(t, err)
			assert.Equal(t, tc.want, cfg.retry.Jitter)
		})
	}
}

func TestLoadConfigRetryStatistics(t *testing.T) {
	for _, tc := range []struct {
		name, learned, window string
		wantLearned           bool
		wantWindow            time.Duration
		wantErr               string
	}{
		{name: "unset: statistics over 1h, no learned policy", wantWindow: time.Hour},
		{name: "learned on", learned: "on", wantLearned: true, wantWindow: time.Hour},
		{name: "learned off", learned: "off", wantWindow: time.Hour},
		{name: "a window", window: "10m", wantWindow: 10 * time.Minute},
		{name: "a bad switch", learned: "maybe", wantErr: "RETRY_LEARNED"},
		{name: "a bad window", window: "soon", wantErr: "RETRY_STATS_WINDOW"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("RETRY_LEARNED", tc.learned)
			t.Setenv("RETRY_STATS_WINDOW", tc.window)
			cfg, err := loadConfig()
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantLearned, cfg.retry.Learned != nil)
			assert.Equal(t, tc.wantWindow, cfg.retryStatsWindow)
		})
	}
}

func TestLoadConfigStopWhenIdle(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        time.Duration
		wantErr     bool
	}{
		{name: "unset: serve until a signal", value: "", want: 0},
		{name: "an idle time", value: "30s", want: 30 * time.Second},
		{name: "zero", value: "0s", wantErr: true},
		{name: "not a duration", value: "soon", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PAYMENTS_STOP_WHEN_IDLE", tc.value)
			cfg, err := loadConfig()
			if tc.wantErr {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "PAYMENTS_STOP_WHEN_IDLE")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, cfg.stopWhenIdle)
		})
	}
}

// ORDERS turns the order saga on for serve; it cannot be combined with what publishes or
// consumes elsewhere than the plain queue of one cluster.
func TestConfig_Orders(t *testing.T) {
	for _, tc := range []struct {
		name, orders, partitions, secondary string
		want                                bool
		wantErr                             string
	}{
		{name: "unset: off", want: false},
		{name: "on", orders: "on", want: true},
		{name: "off", orders: "off", want: false},
		{name: "a bad switch", orders: "yes please", wantErr: "ORDERS"},
		{name: "with partitions", orders: "on", partitions: "4", wantErr: "PAYMENTS_PARTITIONS"},
		{name: "with a secondary cluster", orders: "on", secondary: "amqp://b", wantErr: "AMQP_SECONDARY_URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("ORDERS", tc.orders)
			t.Setenv("PAYMENTS_PARTITIONS", tc.partitions)
			t.Setenv("AMQP_SECONDARY_URL", tc.secondary)
			t.Setenv("AMQP_URL", "amqp://a")
			t.Setenv("PAYMENTS_OUTBOX_DIR", "")
			cfg, err := loadConfig()
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, cfg.orders)
		})
	}
}
