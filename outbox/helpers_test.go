package outbox_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker/amqp"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// connect opens a sluice broker on url and declares queue on it.
func connect(t testing.TB, url, queue string) *amqp.Broker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{url}, Logger: quietLogger(), ReconnectMaxInterval: 500 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	require.NoError(t, b.DeclareQueue(ctx, queue))
	return b
}

// seqMessage is producer p's message number i.
func seqMessage(p, i int) *message.Message {
	m := message.NewMessage(fmt.Sprintf("p%d-%06d", p, i), []byte(fmt.Sprintf(`{"producer":%d,"seq":%d}`, p, i)))
	m.Metadata.Set("producer", strconv.Itoa(p))
	m.Metadata.Set("seq", strconv.Itoa(i))
	return m
}

// produce runs producers goroutines, each publishing its messages from..to-1 one after
// the other, and returns each publish's latency.
func produce(t testing.TB, pub message.Publisher, topic string, producers, from, to int) []time.Duration {
	t.Helper()
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, to-from)
			for i := from; i < to; i++ {
				start := time.Now()
				if err := pub.Publish(topic, seqMessage(p, i)); err != nil {
					errs <- fmt.Errorf("producer %d message %d: %w", p, i, err)
					return
				}
				local = append(local, time.Since(start))
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return lat
}

// received is what a consumer saw: the order in which each producer's messages had their
// side effect (every time it ran), the copies acknowledged as duplicates without running
// it, and every delivery.
type received struct {
	order      map[string][]int
	duplicates int
	total      int
}

// requireAllInOrder checks that each of producers producers' messages from..to-1 had its
// side effect exactly once, in the order published: none lost, none twice, none early.
func requireAllInOrder(t testing.TB, r received, producers, from, to int) {
	t.Helper()
	require.Len(t, r.order, producers, "producers seen")
	for p := 0; p < producers; p++ {
		got := r.order[strconv.Itoa(p)]
		require.Len(t, got, to-from, "producer %d: side effects", p)
		for k, i := range got {
			require.Equal(t, from+k, i, "producer %d: message %d had effect number %d", p, i, k)
		}
	}
}

func percentile(lat []time.Duration, q float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

func quietWatermill() watermill.LoggerAdapter { return watermill.NewSlogLogger(quietLogger()) }
