package outbox_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/outbox"
	"github.com/sluice-go/sluice/outbox/pgoutbox"
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

// BenchmarkOutboxPublishPostgres: one producer publishing one message at a time with the
// broker up, through Watermill's SQL forwarder on PostgreSQL ("sluice": ns/op is the
// insert, the forwarder running beside it) beside sluice's plain confirmed publisher
// ("raw-confirmed"), in the same run. "forwarded-msg/s" is the rate from the first insert
// to the table's last row confirmed by the broker and deleted.
func BenchmarkOutboxPublishPostgres(b *testing.B) {
	rabbit := testenv.NewRabbit(b)
	db, err := sql.Open("postgres", testenv.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	queue := testenv.Name("outbox.bench.pg")
	rabbit.DeleteQueues(queue, topology.DLQ(queue))
	b.Cleanup(func() { rabbit.DeleteQueues(queue, topology.DLQ(queue)) })
	br := connect(b, rabbit.URL, queue)
	payload := []byte(`{"payment_id":"p-1","amount":1250,"currency":"EUR"}`)

	b.Run("raw-confirmed", func(b *testing.B) {
		start := time.Now()
		for i := 0; i < b.N; i++ {
			if err := br.Publisher().Publish(queue, message.NewMessage(testenv.Name("m"), payload)); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
	})
	b.Run("sluice", func(b *testing.B) {
		topic := strings.NewReplacer(".", "_").Replace(testenv.Name("sluice_outbox_bench"))
		defer func() { _, _ = db.Exec(`DROP TABLE IF EXISTS "watermill_` + topic + `"`) }()
		ob, err := pgoutbox.New(db, br.Publisher(), pgoutbox.Config{Topic: topic, Logger: quietWatermill()})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		runDone := make(chan error, 1)
		go func() { runDone <- ob.Run(ctx) }()
		defer func() {
			cancel()
			_ = ob.Close()
			<-runDone
		}()
		<-ob.Running()
		pub, err := ob.DBPublisher()
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			if err := pub.Publish(queue, message.NewMessage(testenv.Name("m"), payload)); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
		b.StopTimer() // ns/op is the insert; the wait for the forwarder is a rate of its own
		for {
			n, err := ob.Pending(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if n == 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "forwarded-msg/s")
	})
}
