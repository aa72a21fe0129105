package amqp_test

import (
	"context"
	"math"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/internal/benchkit/benchenv"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// The load both retry mechanisms of BenchmarkRetryDelayOn43 carry: nativeMessages messages,
// each failing nativeFailures times, its n-th retry asked to wait min(n × nativeMin,
// nativeMax), the one policy RabbitMQ 4.3's delayed retry expresses (linear between a
// minimum and a maximum).
const (
	nativeMessages = 200
	nativeFailures = 5
	nativeMin      = 200 * time.Millisecond
	nativeMax      = 1 * time.Second
)

func nativeDelay(n int) time.Duration { return min(time.Duration(n)*nativeMin, nativeMax) }

// BenchmarkRetryDelayOn43 compares, on RabbitMQ 4.3, the two ways a failed attempt can be
// retried after a delay by the broker (issue 34, point 4), on the same load:
//   - cascade: sluice's hand-off, the retry copy published confirmed through the delay
//     cascade (Broker.Delay) and the delivery acknowledged;
//   - native: a quorum queue declared with x-delayed-retry-type "failed" and
//     x-delayed-retry-min/max, the delivery rejected with requeue; RabbitMQ 4.3 holds it
//     back for min × delivery count, at most max.
//
// It reports each retry's lateness (arrival minus requested delay, from just before the
// hand-off or reject: p50, p99, max, in ms), the broker's CPU time for the whole run
// (broker-cpu-ms, from /proc of the process listening on the AMQP port; 0 when it cannot be
// read) and the retries carried.
func BenchmarkRetryDelayOn43(b *testing.B) {
	testenv.Require43(b)
	url := testenv.AMQPURL(b)
	b.Run("cascade", func(b *testing.B) {
		br := benchenv.Broker(b, url)
		r := testenv.NewRabbit(b)
		q := testenv.Name("bench.retrydelay.cascade")
		r.DeleteQueues(q, topology.DLQ(q))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := br.DeclareQueue(ctx, q); err != nil {
			b.Fatal(err)
		}
		if err := br.DeclareDelays(ctx, nativeMax); err != nil {
			b.Fatal(err)
		}
		sub := br.Subscriber(broker.SubscribeOptions{Concurrency: 16, Prefetch: 64})
		msgs, err := sub.Subscribe(ctx, q)
		if err != nil {
			b.Fatal(err)
		}
		measureRetries(b, url, func() {
			for i := range nativeMessages {
				m := message.NewMessage("retry-"+strconv.Itoa(i), benchenv.Payload)
				if err := br.Publisher().Publish(q, m); err != nil {
					b.Fatal(err)
				}
			}
		}, func(rec *retryRecorder) {
			var wg sync.WaitGroup
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !rec.done() {
						var m *message.Message
						select {
						case m = <-msgs:
						case <-time.After(100 * time.Millisecond):
							continue
						}
						n, _ := strconv.Atoi(m.Metadata.Get("x-bench-failures"))
						rec.arrived(m.UUID, n)
						if n == nativeFailures {
							m.Ack()
							continue
						}
						c := message.NewMessage(m.UUID, m.Payload)
						c.Metadata.Set("x-bench-failures", strconv.Itoa(n+1))
						rec.handedOff(m.UUID, n+1, nativeDelay(n+1))
						if err := br.Delay(ctx, q, nativeDelay(n+1), c); err != nil {
							b.Error(err)
						}
						m.Ack()
					}
				}()
			}
			wg.Wait()
		})
	})
	b.Run("native", func(b *testing.B) {
		r := testenv.NewRabbit(b)
		q := testenv.Name("bench.retrydelay.native")
		r.DeleteQueues(q)
		conn, err := amqp091.Dial(url)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ch.QueueDeclare(q, true, false, false, false, amqp091.Table{
			"x-queue-type": "quorum", "x-delayed-retry-type": "failed",
			"x-delayed-retry-min": nativeMin.Milliseconds(), "x-delayed-retry-max": nativeMax.Milliseconds(),
			"x-delivery-limit": int64(nativeFailures + 5),
		}); err != nil {
			b.Fatal(err)
		}
		if err := ch.Qos(nativeMessages, 0, false); err != nil {
			b.Fatal(err)
		}
		deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		measureRetries(b, url, func() {
			for i := range nativeMessages {
				r.Publish(q, amqp091.Publishing{MessageId: "retry-" + strconv.Itoa(i), DeliveryMode: amqp091.Persistent, Body: benchenv.Payload})
			}
		}, func(rec *retryRecorder) {
			for !rec.done() {
				var d amqp091.Delivery
				select {
				case d = <-deliveries:
				case <-time.After(100 * time.Millisecond):
					continue
				}
				n := 0
				if c, ok := d.Headers["x-delivery-count"].(int64); ok {
					n = int(c)
				}
				rec.arrived(d.MessageId, n)
				if n == nativeFailures {
					_ = d.Ack(false)
					continue
				}
				rec.handedOff(d.MessageId, n+1, nativeDelay(n+1))
				if err := d.Reject(true); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// retryRecorder notes when each message's retry was handed off and when it arrived.
type retryRecorder struct {
	mu      sync.Mutex
	due     map[string]time.Time // id/attempt -> hand-off time + requested delay
	late    []time.Duration
	settled int
	deadln  time.Time
}

func retryKey(id string, n int) string { return id + "/" + strconv.Itoa(n) }

func (r *retryRecorder) handedOff(id string, n int, d time.Duration) {
	r.mu.Lock()
	r.due[retryKey(id, n)] = time.Now().Add(d)
	r.mu.Unlock()
}

func (r *retryRecorder) arrived(id string, n int) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if due, ok := r.due[retryKey(id, n)]; ok {
		r.late = append(r.late, now.Sub(due))
		delete(r.due, retryKey(id, n))
	}
	if n == nativeFailures {
		r.settled++
	}
}

func (r *retryRecorder) done() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.settled == nativeMessages || time.Now().After(r.deadln)
}

// measureRetries runs b.N rounds of publish then consume, and reports lateness and the
// broker's CPU time.
func measureRetries(b *testing.B, url string, publish func(), consume func(*retryRecorder)) {
	brokerCPU := benchenv.BrokerCPU(url)
	var all []time.Duration
	cpu0 := brokerCPU()
	b.ResetTimer()
	for range b.N {
		rec := &retryRecorder{due: map[string]time.Time{}, deadln: time.Now().Add(2 * time.Minute)}
		publish()
		consume(rec)
		if rec.settled != nativeMessages {
			b.Fatalf("%d of %d messages reached their last attempt", rec.settled, nativeMessages)
		}
		all = append(all, rec.late...)
	}
	b.StopTimer()
	cpu := brokerCPU() - cpu0
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	pct := func(p float64) float64 {
		i := max(int(math.Ceil(p*float64(len(all))))-1, 0)
		return float64(all[i]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.50), "p50-late-ms")
	b.ReportMetric(pct(0.99), "p99-late-ms")
	b.ReportMetric(pct(1), "max-late-ms")
	b.ReportMetric(float64(len(all))/float64(b.N), "retries/op")
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "broker-cpu-ms/op")
}
