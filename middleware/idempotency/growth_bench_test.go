package idempotency_test

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"

	"github.com/sluice-go/sluice/internal/benchkit/benchenv"
	"github.com/sluice-go/sluice/middleware/idempotency"
)

// BenchmarkStoreGrowth measures the store as it grows: filled with 1M or 10M done keys
// (once, outside the timer), each operation is, at random, a duplicate of a held key (3 in
// 4: Begin finds it done) or a new key (1 in 4: Begin and Complete), from one goroutine.
// ns/op and cpu-ns/op (the process's CPU time, which other processes' load moves far less)
// should stay flat from 1M to 10M keys; bytes/key is the live heap the fill added
// per key, which should too.
func BenchmarkStoreGrowth(b *testing.B) {
	for _, n := range []int{1_000_000, 10_000_000} {
		var (
			store    *idempotency.Store
			perKey   float64
			freshSeq uint64
		)
		// Closed when the parent ends: go test calls the sub-benchmark with growing b.N.
		b.Cleanup(func() {
			if store != nil {
				_ = store.Close()
			}
		})
		b.Run(strconv.Itoa(n/1_000_000)+"M", func(b *testing.B) {
			if store == nil {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				s, err := idempotency.NewStore(idempotency.Config{TTL: benchWindow, MaxKeys: n * 3 / 2})
				if err != nil {
					b.Fatal(err)
				}
				for i := range n {
					lease, _, _ := s.Begin(benchKey(i))
					s.Complete(lease)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				if s.Len() != n {
					b.Fatalf("store holds %d keys, want %d", s.Len(), n)
				}
				store, perKey = s, float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(n)
			}
			rng := rand.New(rand.NewPCG(uint64(b.N), 42))
			prefix := []byte("fresh-")
			buf := make([]byte, 0, 64)
			b.ReportAllocs()
			b.ResetTimer()
			startCPU := benchenv.CPUTime()
			for range b.N {
				var key string
				if rng.IntN(4) == 0 {
					freshSeq++
					key = string(strconv.AppendUint(prefix, freshSeq, 10))
				} else {
					buf = appendBenchKey(buf[:0], rng.IntN(n))
					key = string(buf)
				}
				if lease, status, _ := store.Begin(key); status == idempotency.Acquired {
					store.Complete(lease)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((benchenv.CPUTime()-startCPU).Nanoseconds())/float64(b.N), "cpu-ns/op")
			b.ReportMetric(perKey, "bytes/key")
		})
	}
}

// appendBenchKey appends benchKey(i) to dst without fmt, so that building a key costs
// little beside the store's work.
func appendBenchKey(dst []byte, i int) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, "0198c5e2-"...)
	for shift := 12; shift >= 0; shift -= 4 {
		dst = append(dst, hex[(i>>48>>shift)&0xf])
	}
	dst = append(dst, "-7000-8000-"...)
	for shift := 44; shift >= 0; shift -= 4 {
		dst = append(dst, hex[(i>>shift)&0xf])
	}
	return dst
}
