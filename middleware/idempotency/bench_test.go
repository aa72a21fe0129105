package idempotency_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/middleware/idempotency"
)

// Each benchmark measures sluice's store beside Watermill's middleware.Deduplicator with
// its map repository, the same way. Note what is compared: Watermill marks a key seen
// before the handler runs and has no in-flight state, so a failed attempt's retry is
// dropped as a duplicate; sluice does a begin and a complete per new key.

const benchWindow = 24 * time.Hour

// benchKey is a UUID-shaped key (36 bytes), built fresh each call, as a key read from a
// message would be.
func benchKey(i int) string {
	return fmt.Sprintf("0198c5e2-%04x-7000-8000-%012x", i>>48&0xffff, i&0xffffffffffff)
}

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	return keys
}

// BenchmarkStore_Parallel: both stores hold the same 2^20 done keys; then each operation
// is, at random, a duplicate of one of them (3 in 4: sluice's Begin finds it done) or a
// new key (1 in 4: sluice's Begin and Complete). dup/op reports the mix.
func BenchmarkStore_Parallel(b *testing.B) {
	keys := benchKeys(1 << 20)
	sluiceStore, err := idempotency.NewStore(idempotency.Config{TTL: benchWindow, MaxKeys: 1 << 24})
	if err != nil {
		b.Fatal(err)
	}
	defer sluiceStore.Close()
	sluiceOp := func(key string) bool {
		lease, status, _ := sluiceStore.Begin(key)
		if status != idempotency.Acquired {
			return true
		}
		sluiceStore.Complete(lease)
		return false
	}
	repo, err := middleware.NewMapExpiringKeyRepository(benchWindow)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	watermillOp := func(key string) bool {
		dup, err := repo.IsDuplicate(ctx, key)
		if err != nil {
			b.Error(err)
		}
		return dup
	}
	for _, k := range keys {
		sluiceOp(k)
		watermillOp(k)
	}

	var goroutine atomic.Uint64
	run := func(b *testing.B, op func(key string) (duplicate bool)) {
		var dups atomic.Int64
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			g := goroutine.Add(1)
			rng := rand.New(rand.NewPCG(g, 42))
			prefix := fmt.Appendf(nil, "fresh-%d-", g)
			var n int64
			for i := uint64(0); pb.Next(); i++ {
				key := keys[rng.IntN(len(keys))]
				if rng.IntN(4) == 0 {
					// Same cost for both stores: one small allocation.
					key = string(strconv.AppendUint(prefix, i, 10))
				}
				if op(key) {
					n++
				}
			}
			dups.Add(n)
		})
		b.ReportMetric(float64(dups.Load())/float64(b.N), "dup/op")
	}
	b.Run("sluice", func(b *testing.B) { run(b, sluiceOp) })
	b.Run("watermill", func(b *testing.B) { run(b, watermillOp) })
}

// BenchmarkMiddleware_Parallel: 2^16 messages, drawn at random, through each middleware,
// with the key in idempotency-key metadata and a handler that does nothing; after the
// first pass over them nearly every message is a duplicate.
func BenchmarkMiddleware_Parallel(b *testing.B) {
	msgs := make([]*message.Message, 1<<16)
	for i := range msgs {
		msgs[i] = newMessage(fmt.Sprint("m-", i), benchKey(i))
	}
	nop := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	var seed atomic.Uint64
	run := func(b *testing.B, h message.HandlerFunc) {
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			rng := rand.New(rand.NewPCG(seed.Add(1), 7))
			for pb.Next() {
				// Two goroutines may draw the same key at once: sluice defers the second.
				if _, err := h(msgs[rng.IntN(len(msgs))]); err != nil && sluice.ClassOf(err) != sluice.ClassDefer {
					b.Error(err)
				}
			}
		})
	}
	b.Run("sluice", func(b *testing.B) {
		g, err := idempotency.New(idempotency.Config{TTL: benchWindow})
		if err != nil {
			b.Fatal(err)
		}
		defer g.Close()
		run(b, g.Middleware(nop))
	})
	b.Run("watermill", func(b *testing.B) {
		repo, err := middleware.NewMapExpiringKeyRepository(benchWindow)
		if err != nil {
			b.Fatal(err)
		}
		d := &middleware.Deduplicator{
			KeyFactory: middleware.NewMessageHasherFromMetadataField(sluice.HeaderIdempotencyKey),
			Repository: repo,
			Timeout:    time.Minute,
		}
		run(b, d.Middleware(nop))
	})
}

// BenchmarkStore_BytesPerKey fills each store with 1,000,000 done keys and reports the
// live heap it grew by per key. Run it with -benchtime=1x: one fill is the measurement.
func BenchmarkStore_BytesPerKey(b *testing.B) {
	const n = 1_000_000
	measure := func(b *testing.B, fill func() any) {
		for range b.N {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			store := fill()
			runtime.GC()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(store)
			b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/n, "bytes/key")
		}
	}
	b.Run("sluice", func(b *testing.B) {
		measure(b, func() any {
			// Capacity is split over shards, which fill unevenly: leave room so that all
			// n keys are held and none is evicted.
			s, err := idempotency.NewStore(idempotency.Config{TTL: benchWindow, MaxKeys: n * 5 / 4})
			if err != nil {
				b.Fatal(err)
			}
			for i := range n {
				lease, _, _ := s.Begin(benchKey(i))
				s.Complete(lease)
			}
			if s.Len() != n {
				b.Fatalf("store holds %d keys, want %d", s.Len(), n)
			}
			return s
		})
	})
	b.Run("watermill", func(b *testing.B) {
		measure(b, func() any {
			repo, err := middleware.NewMapExpiringKeyRepository(benchWindow)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			for i := range n {
				if _, err := repo.IsDuplicate(ctx, benchKey(i)); err != nil {
					b.Fatal(err)
				}
			}
			return repo
		})
	})
}
