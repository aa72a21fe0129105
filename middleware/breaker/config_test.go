package breaker_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/middleware/breaker"
)

func TestConfig_Validate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     breaker.Config
		wantErr string
	}{
		{name: "zero value", cfg: breaker.Config{}},
		{name: "full", cfg: breaker.Config{
			Name: "gw", ConsecutiveFailures: 3, FailureRatio: 0.5, MinRequests: 10,
			Interval: time.Minute, OpenTimeout: time.Second, HalfOpenProbes: 2, Spread: -1,
		}},
		{name: "ratio one", cfg: breaker.Config{FailureRatio: 1}},
		{name: "negative consecutive failures", cfg: breaker.Config{ConsecutiveFailures: -1}, wantErr: "ConsecutiveFailures -1"},
		{name: "consecutive failures too large", cfg: breaker.Config{ConsecutiveFailures: math.MaxUint32 + 1}, wantErr: "ConsecutiveFailures 4294967296"},
		{name: "negative ratio", cfg: breaker.Config{FailureRatio: -0.1}, wantErr: "FailureRatio -0.1"},
		{name: "ratio above one", cfg: breaker.Config{FailureRatio: 1.5}, wantErr: "FailureRatio 1.5"},
		{name: "NaN ratio", cfg: breaker.Config{FailureRatio: math.NaN()}, wantErr: "FailureRatio NaN"},
		{name: "negative min requests", cfg: breaker.Config{MinRequests: -2}, wantErr: "MinRequests -2"},
		{name: "negative interval", cfg: breaker.Config{Interval: -time.Second}, wantErr: "Interval -1s"},
		{name: "negative open timeout", cfg: breaker.Config{OpenTimeout: -time.Second}, wantErr: "OpenTimeout -1s"},
		{name: "negative probes", cfg: breaker.Config{HalfOpenProbes: -1}, wantErr: "HalfOpenProbes -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, tt.wantErr)
			}
			_, err = breaker.New(tt.cfg)
			if tt.wantErr == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, tt.wantErr, "New must validate")
			}
		})
	}
}

func TestConfig_Defaults(t *testing.T) {
	tests := []struct {
		name string
		cfg  breaker.Config
		want func(t *testing.T, c breaker.Config)
	}{
		{name: "zero value", cfg: breaker.Config{}, want: func(t *testing.T, c breaker.Config) {
			assert.Zero(t, c.ConsecutiveFailures, "a run of failures of one message must not trip")
			assert.Equal(t, breaker.DefaultFailureRatio, c.FailureRatio)
			assert.Equal(t, breaker.DefaultMinRequests, c.MinRequests)
			assert.Equal(t, breaker.DefaultInterval, c.Interval)
			assert.Equal(t, breaker.DefaultOpenTimeout, c.OpenTimeout)
			assert.Equal(t, breaker.DefaultHalfOpenProbes, c.HalfOpenProbes)
			assert.Equal(t, breaker.MaxDefaultSpread, c.Spread, "a tenth of 30s is capped")
			assert.NotNil(t, c.Logger)
		}},
		{name: "consecutive only disables the ratio", cfg: breaker.Config{ConsecutiveFailures: 3}, want: func(t *testing.T, c breaker.Config) {
			assert.Equal(t, 3, c.ConsecutiveFailures)
			assert.Zero(t, c.FailureRatio)
		}},
		{name: "ratio only disables consecutive", cfg: breaker.Config{FailureRatio: 0.5}, want: func(t *testing.T, c breaker.Config) {
			assert.Zero(t, c.ConsecutiveFailures)
			assert.Equal(t, breaker.DefaultMinRequests, c.MinRequests)
		}},
		{name: "short open timeout spreads a tenth", cfg: breaker.Config{OpenTimeout: 2 * time.Second}, want: func(t *testing.T, c breaker.Config) {
			assert.Equal(t, 200*time.Millisecond, c.Spread)
		}},
		{name: "negative spread disables it", cfg: breaker.Config{Spread: -1}, want: func(t *testing.T, c breaker.Config) {
			assert.Zero(t, c.Spread)
		}},
		{name: "explicit values kept", cfg: breaker.Config{ConsecutiveFailures: 7, FailureRatio: 0.3, MinRequests: 3, Spread: time.Millisecond}, want: func(t *testing.T, c breaker.Config) {
			assert.Equal(t, 7, c.ConsecutiveFailures)
			assert.Equal(t, 3, c.MinRequests)
			assert.Equal(t, time.Millisecond, c.Spread)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.want(t, breaker.WithDefaults(tt.cfg))
		})
	}
}
