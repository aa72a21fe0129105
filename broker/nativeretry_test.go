package broker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
)

func TestNativeRetry_Validate(t *testing.T) {
	tests := []struct {
		name    string
		r       broker.NativeRetry
		wantErr string
	}{
		{name: "linear 200ms to 1s", r: broker.NativeRetry{Min: 200 * time.Millisecond, Max: time.Second, MaxRetries: 5}},
		{name: "constant", r: broker.NativeRetry{Min: time.Second, Max: time.Second}},
		{name: "no Min", r: broker.NativeRetry{Max: time.Second}, wantErr: "Min 0s is below 1ms"},
		{name: "Max below Min", r: broker.NativeRetry{Min: time.Second, Max: time.Millisecond}, wantErr: "Max 1ms is below Min 1s"},
		{name: "not whole milliseconds", r: broker.NativeRetry{Min: 1500 * time.Microsecond, Max: time.Second}, wantErr: "must be whole milliseconds"},
		{name: "negative MaxRetries", r: broker.NativeRetry{Min: time.Second, Max: time.Second, MaxRetries: -1}, wantErr: "MaxRetries -1 is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.r.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, broker.ErrNativeRetry)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

func TestNativeRetry_Delay(t *testing.T) {
	r := broker.NativeRetry{Min: 200 * time.Millisecond, Max: time.Second}
	var got []time.Duration
	for n := 0; n <= 7; n++ {
		got = append(got, r.Delay(n))
	}
	// What RabbitMQ 4.3 holds a rejected delivery back for: Min × its delivery count, at
	// most Max (n below 1 is the first retry).
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{200 * ms, 200 * ms, 400 * ms, 600 * ms, 800 * ms, time.Second, time.Second, time.Second}, got)
	assert.Equal(t, time.Second, r.Delay(1<<62), "no overflow")
	assert.Equal(t, time.Duration(0), broker.NativeRetry{}.Delay(3), "the zero schedule holds nothing back")
}
