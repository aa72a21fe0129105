package outbox_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/internal/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/outbox"
)

// BenchmarkOutboxPublish: one producer publishing one message at a time with the broker up,
// through the outbox ("sluice") beside sluice's plain confirmed publisher it wraps
// ("raw-confirmed"), in the same run. ns/op is a publish's latency.
func BenchmarkOutboxPublish(b *testing.B) {
	rabbit := testenv.NewRabbit(b)
	queue := testenv.Name("outbox.bench")
	rabbit.DeleteQueues(queue, topology.DLQ(queue))
	br := connect(b, rabbit.URL, queue)
	payload := []byte(`{"payment_id":"p-1","amount":1250,"currency":"EUR"}`)

	run := func(b *testing.B, pub message.Publisher) {
		b.ReportAllocs()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			if err := pub.Publish(queue, message.NewMessage(testenv.Name("m"), payload)); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
	}
	b.Run("raw-confirmed", func(b *testing.B) { run(b, br.Publisher()) })
	b.Run("sluice", func(b *testing.B) {
		ob, err := outbox.New(br.Publisher(), outbox.Config{Dir: b.TempDir(), Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		defer ob.Close()
		run(b, ob)
		if st := ob.Stats(); st.Kept != 0 {
			b.Fatalf("%d messages went to the outbox with the broker up", st.Kept)
		}
	})
}

// BenchmarkOutboxKeep is the outage path: the broker is away, so every publish is written
// to the outbox file and fsynced. "sequential" is one producer's latency; "parallel" is
// the throughput of GOMAXPROCS×8 producers whose writes share fsyncs.
func BenchmarkOutboxKeep(b *testing.B) {
	payload := []byte(`{"payment_id":"p-1","amount":1250,"currency":"EUR"}`)
	open := func(b *testing.B) *outbox.Publisher {
		ob, err := outbox.New(failing{}, outbox.Config{Dir: b.TempDir(), RetryMaxInterval: time.Hour, Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		// The first publish meets the failing broker; later ones queue behind it.
		if err := ob.Publish("q", message.NewMessage("first", payload)); err != nil {
			b.Fatal(err)
		}
		return ob
	}
	b.Run("sequential", func(b *testing.B) {
		ob := open(b)
		defer ob.Close()
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			if err := ob.Publish("q", message.NewMessage("m", payload)); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
	})
	b.Run("parallel", func(b *testing.B) {
		ob := open(b)
		defer ob.Close()
		b.ReportAllocs()
		b.SetParallelism(8)
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := ob.Publish("q", message.NewMessage("m", payload)); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
	})
}
