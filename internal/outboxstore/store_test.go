package outboxstore_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/outboxstore"
)

func entry(topic string, i int) outboxstore.Entry {
	return outboxstore.Entry{Topic: topic, UUID: fmt.Sprintf("m%04d", i), Payload: []byte(`{"n":1}`), Metadata: map[string]string{"k": "v"}}
}

// entrySize is the encoded size of entry's entries.
var entrySize = func() int64 {
	b, err := json.Marshal(entry("q", 0))
	if err != nil {
		panic(err)
	}
	return int64(len(b))
}()

func TestStore_KeepsOrderAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := outboxstore.OpenStore(dir, 1000, 1<<20)
	require.NoError(t, err)
	for i := 0; i < 10; i++ {
		require.NoError(t, s.Append([]outboxstore.Entry{entry("q", i)}))
	}
	require.NoError(t, s.Close())

	s, err = outboxstore.OpenStore(dir, 1000, 1<<20)
	require.NoError(t, err)
	defer s.Close()
	n, _ := s.Len()
	require.Equal(t, 10, n)
	got, err := s.Peek(100)
	require.NoError(t, err)
	require.Len(t, got, 10)
	for i, e := range got {
		require.Equal(t, fmt.Sprintf("m%04d", i), e.UUID)
		require.Equal(t, "v", e.Metadata["k"])
		require.Equal(t, "q", e.Topic)
	}
	require.NoError(t, s.Remove(got[0].Seq, got[1].Seq))
	require.NoError(t, s.Reject("unroutable", got[2].Seq))
	n, _ = s.Len()
	require.Equal(t, 7, n)
	rejected, err := s.Rejected()
	require.NoError(t, err)
	require.Len(t, rejected, 1)
	require.Equal(t, "m0002", rejected[0].UUID)
	require.Equal(t, "unroutable", rejected[0].Reason)
	next, err := s.Peek(1)
	require.NoError(t, err)
	require.Equal(t, "m0003", next[0].UUID)
}

func TestStore_Bounded(t *testing.T) {
	tests := []struct {
		name       string
		maxEntries int
		maxBytes   int64
		accepted   int
	}{
		{"by messages", 5, 1 << 20, 5},
		{"by bytes", 1000, 3*entrySize + entrySize/2, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := outboxstore.OpenStore(t.TempDir(), tt.maxEntries, tt.maxBytes)
			require.NoError(t, err)
			defer s.Close()
			accepted := 0
			for i := 0; i < 10; i++ {
				err := s.Append([]outboxstore.Entry{entry("q", i)})
				if err != nil {
					require.ErrorIs(t, err, outboxstore.ErrFull)
					continue
				}
				accepted++
			}
			require.Equal(t, tt.accepted, accepted)
			got, err := s.Peek(100)
			require.NoError(t, err)
			require.NoError(t, s.Remove(got[0].Seq))
			require.NoError(t, s.Append([]outboxstore.Entry{entry("q", 99)}), "room again after a removal")
		})
	}
}

func TestStore_ConcurrentAppendsKeepEachCallersOrder(t *testing.T) {
	s, err := outboxstore.OpenStore(t.TempDir(), 100000, 1<<30)
	require.NoError(t, err)
	defer s.Close()
	const callers, each = 8, 50
	var wg sync.WaitGroup
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				require.NoError(t, s.Append([]outboxstore.Entry{entry(fmt.Sprint(c), i)}))
			}
		}()
	}
	wg.Wait()
	got, err := s.Peek(callers * each)
	require.NoError(t, err)
	require.Len(t, got, callers*each)
	next := map[string]int{}
	for _, e := range got {
		require.Equal(t, fmt.Sprintf("m%04d", next[e.Topic]), e.UUID, "caller %s", e.Topic)
		next[e.Topic]++
	}
	n, _ := s.Len()
	require.Equal(t, callers*each, n)
}

func TestStore_ClosedRefusesAppends(t *testing.T) {
	s, err := outboxstore.OpenStore(t.TempDir(), 10, 1<<20)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.ErrorIs(t, s.Append([]outboxstore.Entry{entry("q", 0)}), outboxstore.ErrClosed)
	require.NoError(t, s.Close())
}
