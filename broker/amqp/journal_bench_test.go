package amqp_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/benchkit/benchenv"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// journalBenchBody is one append of the idempotency journal under load: 16 records of
// 24 bytes and the batch's 12 (middleware/idempotency's encoding), the size a round
// carries when a queue is consumed at full speed (BenchmarkConsume's records/append).
var journalBenchBody = make([]byte, 12+16*24)

// BenchmarkJournalAppend appends b.N journal messages one at a time, each waiting for its
// confirm as the idempotency step's committer does, and reports what each costs the
// broker and this process (broker-cpu-us/append, cpu-us/append): the journal's cost per
// round, which a queue consumed at full speed pays once per records/append messages. Each
// variant has a new stream:
//   - alone: nobody follows the stream: the append's own cost;
//   - follow-others: the journal's follower runs as the idempotency step runs it
//     (FollowOthers): on RabbitMQ 3.13 and later it reads markers only while no other
//     writer appends (a stream filter), so the broker leaves this writer's records out;
//     before 3.13 it is sent every record back and skips them in the client;
//   - follow-all: a follower that reads every record back (Follow), as every instance's
//     did before issue 55.
//
// own-read/append is how many of its own appends the follower was sent back.
func BenchmarkJournalAppend(b *testing.B) {
	url := testenv.AMQPURL(b)
	run := func(b *testing.B, follow func(ctx context.Context, j broker.Journal, caught func()) error) {
		br := benchenv.Broker(b, url)
		r := testenv.NewRabbit(b)
		name := testenv.Name("bench.journal")
		r.DeleteQueues(name)
		b.Cleanup(func() { r.DeleteQueues(name) })
		j := br.Journal(name, time.Hour)
		ctx, cancel := context.WithCancel(context.Background())
		followed := make(chan error, 1)
		if follow != nil {
			caught := make(chan struct{})
			go func() { followed <- follow(ctx, j, func() { close(caught) }) }()
			select {
			case <-caught:
			case <-time.After(30 * time.Second):
				b.Fatal("the follower did not catch up within 30s")
			}
		} else {
			followed <- nil
		}
		defer func() {
			cancel()
			<-followed
		}()
		// The first append declares nothing new but waits for a new stream's writer; and a
		// follower reading markers only switches once it has caught up: neither is timed.
		if err := j.Append(ctx, journalBenchBody); err != nil {
			b.Fatal(err)
		}
		waitFiltered(b, j, follow != nil)
		st0, _ := amqp.JournalStatsOf(j)
		brokerCPU := benchenv.BrokerCPU(url)
		cpu0, own0 := brokerCPU(), benchenv.CPUTime()
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			if err := j.Append(ctx, journalBenchBody); err != nil {
				b.Fatal(err)
			}
		}
		elapsed := time.Since(start)
		b.StopTimer()
		// The follower's reads of the last appends come just after their confirms.
		time.Sleep(100 * time.Millisecond)
		brokerUsed, own := brokerCPU()-cpu0, benchenv.CPUTime()-own0
		st, _ := amqp.JournalStatsOf(j)
		n := float64(b.N)
		b.ReportMetric(n/elapsed.Seconds(), "appends/s")
		b.ReportMetric(float64(brokerUsed.Microseconds())/n, "broker-cpu-us/append")
		b.ReportMetric(float64(own.Microseconds())/n, "cpu-us/append")
		b.ReportMetric(float64(st.OwnRecordsRead-st0.OwnRecordsRead)/n, "own-read/append")
	}
	b.Run("alone", func(b *testing.B) { run(b, nil) })
	b.Run("follow-others", func(b *testing.B) {
		run(b, func(ctx context.Context, j broker.Journal, caught func()) error {
			oj, ok := j.(interface {
				FollowOthers(context.Context, time.Time, func([]byte), func(), func()) error
			})
			if !ok {
				b.Fatal("the stream journal does not follow others' records only")
			}
			return oj.FollowOthers(ctx, time.Now().Add(-time.Hour), func([]byte) {}, caught, func() {})
		})
	})
	b.Run("follow-all", func(b *testing.B) {
		run(b, func(ctx context.Context, j broker.Journal, caught func()) error {
			return j.Follow(ctx, time.Now().Add(-time.Hour), func([]byte) {}, caught)
		})
	})
}

// waitFiltered waits, on RabbitMQ 4.3 (which filters streams), for a FollowOthers
// follower to read markers only, as it does at once after restoring a stream no other
// writer appended to; elsewhere (3.10, a Follow) it returns at once.
func waitFiltered(b *testing.B, j broker.Journal, following bool) {
	b.Helper()
	if !following || !testenv.Is43() {
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if st, _ := amqp.JournalStatsOf(j); st.MarkersOnly {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
