package idempotency_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/middleware/idempotency"
)

func TestStore_SnapshotRoundTrip(t *testing.T) {
	const done = 20
	tests := []struct {
		name       string
		maxKeys    int
		wantLoaded int // newest done keys expected back
	}{
		{name: "same capacity keeps every live done key", maxKeys: 100, wantLoaded: done},
		{name: "smaller capacity keeps the latest to expire", maxKeys: 5, wantLoaded: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newClock()
			path := filepath.Join(t.TempDir(), "keys.snap")
			src := newTestStore(t, clock, 100)
			complete(t, src, "expired")
			clock.Advance(testTTL / 2)
			for i := range done {
				complete(t, src, fmt.Sprint("done", i))
				clock.Advance(time.Second)
			}
			_, status, _ := src.Begin("flying")
			require.Equal(t, idempotency.Acquired, status)
			clock.Advance(testTTL / 2) // "expired" is now past its TTL
			require.NoError(t, src.SaveSnapshot(path))

			dst := newTestStore(t, clock, tt.maxKeys)
			require.NoError(t, dst.LoadSnapshot(path))
			assert.Equal(t, tt.wantLoaded, dst.Len())
			for i := done - 1; i >= 0; i-- { // newest first: a Begin that acquires may evict
				_, status, _ := dst.Begin(fmt.Sprint("done", i))
				want := idempotency.Acquired
				if i >= done-tt.wantLoaded {
					want = idempotency.Done
				}
				assert.Equal(t, want, status, "done%d", i)
			}
			for _, key := range []string{"expired", "flying"} {
				_, status, _ := dst.Begin(key)
				assert.Equal(t, idempotency.Acquired, status, key)
			}
		})
	}
}

func TestStore_SnapshotLoadedAtNewAndSavedOnClose(t *testing.T) {
	clock := newClock()
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.snap")
	cfg := idempotency.Config{TTL: testTTL, Now: clock.Now, SnapshotPath: path}

	first, err := idempotency.NewStore(cfg) // the file does not exist yet: not an error
	require.NoError(t, err)
	complete(t, first, "a")
	require.NoError(t, first.Close())
	require.NoError(t, first.Close(), "second Close")

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file left beside the snapshot")
	assert.Equal(t, "keys.snap", entries[0].Name())

	second, err := idempotency.NewStore(cfg)
	require.NoError(t, err)
	_, status, _ := second.Begin("a")
	assert.Equal(t, idempotency.Done, status)
	complete(t, second, "b")
	require.NoError(t, second.Close()) // replaces the file

	third, err := idempotency.NewStore(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = third.Close() })
	for _, key := range []string{"a", "b"} {
		_, status, _ := third.Begin(key)
		assert.Equal(t, idempotency.Done, status, key)
	}
}

func TestStore_SnapshotErrors(t *testing.T) {
	valid := func(t *testing.T) []byte {
		t.Helper()
		s := newTestStore(t, newClock(), 100)
		complete(t, s, "a")
		complete(t, s, "b")
		path := filepath.Join(t.TempDir(), "valid.snap")
		require.NoError(t, s.SaveSnapshot(path))
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		return b
	}
	tests := []struct {
		name    string
		corrupt func(b []byte) []byte
		wantIs  error
	}{
		{name: "empty file", corrupt: func([]byte) []byte { return nil }, wantIs: idempotency.ErrSnapshotCorrupt},
		{name: "truncated", corrupt: func(b []byte) []byte { return b[:len(b)-7] }, wantIs: idempotency.ErrSnapshotCorrupt},
		{name: "flipped bit in a key", corrupt: func(b []byte) []byte { b[30] ^= 1; return b }, wantIs: idempotency.ErrSnapshotCorrupt},
		{name: "wrong magic", corrupt: func(b []byte) []byte { b[0] = 'X'; return b }, wantIs: idempotency.ErrSnapshotCorrupt},
		{name: "wrong version", corrupt: func(b []byte) []byte { b[8] = 9; return b }, wantIs: idempotency.ErrSnapshotCorrupt},
		{name: "count disagrees with size", corrupt: func(b []byte) []byte { b[16] = 3; return b }, wantIs: idempotency.ErrSnapshotCorrupt},
		{name: "missing file", corrupt: nil, wantIs: fs.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys.snap")
			if tt.corrupt != nil {
				require.NoError(t, os.WriteFile(path, tt.corrupt(valid(t)), 0o600))
			}
			s := newTestStore(t, newClock(), 100)
			err := s.LoadSnapshot(path)
			require.ErrorIs(t, err, tt.wantIs)
			assert.Zero(t, s.Len(), "a bad file adds nothing")

			_, err = idempotency.NewStore(idempotency.Config{SnapshotPath: path})
			if tt.corrupt == nil {
				assert.NoError(t, err, "NewStore starts empty without a snapshot")
			} else {
				assert.ErrorIs(t, err, idempotency.ErrSnapshotCorrupt, "NewStore refuses a corrupt snapshot")
			}
		})
	}
}

func TestStore_SaveSnapshotFailureLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	s := newTestStore(t, newClock(), 100)
	complete(t, s, "a")
	err := s.SaveSnapshot(filepath.Join(dir, "missing", "keys.snap"))
	require.Error(t, err)
	assert.ErrorContains(t, err, "missing")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries)
}

func TestGuard_PeriodicSnapshotSurvivesACrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.snap")
	g, err := idempotency.New(idempotency.Config{SnapshotPath: path, SnapshotInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close() })
	complete(t, g.Store(), "paid")

	// No Close: the process "crashes". The periodic write must already hold the key.
	require.Eventually(t, func() bool {
		restarted, err := idempotency.NewStore(idempotency.Config{SnapshotPath: path})
		if err != nil {
			return false
		}
		defer restarted.Close()
		_, status, _ := restarted.Begin("paid")
		return status == idempotency.Done
	}, 5*time.Second, 10*time.Millisecond, "the key is in a snapshot written while running")
}
