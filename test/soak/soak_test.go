//go:build soak

// Package soak holds the soak run (issue 38): the payment service, as its own process,
// consumes a steady stream of requests from RabbitMQ for SOAK_DURATION (default 30m) at
// SOAK_RATE requests a second (default 100), about 20% of them failing transiently and
// recovering on a retry, 3% declined for good and 5% duplicates of a settled payment.
// Every 10 s the soak samples the service's resident memory, Go heap in use, goroutines,
// AMQP connections and channels; after the warm-up (a fifth of the run, at least a
// minute) a series that keeps growing beyond its bound (Judge, bounds) fails the run, as
// does a payment not accounted for. Run it with `make soak`; SOAK_RECORD=1 writes the
// table into BENCHMARKS.md's "## Soak" section.
package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// The mix of requests, as shares of those sent: transient failures that recover on a
// retry (split over the gateway's three recovering tokens), permanent declines, and
// duplicates of a payment already settled. The rest are charged at once.
const (
	shareFlaky1      = 0.10
	shareFlaky2      = 0.07
	shareRateLimited = 0.03 // transient: 0.20 in all
	sharePermanent   = 0.03
	shareDuplicate   = 0.05
)

// duplicateAfter is how old a payment must be before the soak sends it again: by then it
// is settled, so the duplicate meets a completed key, as a client's double submit does.
const duplicateAfter = 3 * time.Second

// duplicateWithin is how old a payment may be when the soak sends it again: well inside
// what the service's bounded idempotency store remembers (idempotencyMaxKeys payments,
// 200 s at 100/s). A duplicate older than that is charged again, by design: the store
// evicts its oldest keys at its bound (a 10-minute run that sent duplicates of payments
// minutes old charged 1,919 of them twice).
const duplicateWithin = 30 * time.Second

// prefillPayments are sent before the clock starts, as fast as the service takes them:
// enough to fill the service's bounded memories (the gateway's ledger, LedgerLimit 20,000
// payments in cmd/payments, and the idempotency store, idempotencyMaxKeys), so that even
// CI's 3-minute run judges the steady state rather than their filling, which at 100/s
// would take over 3 minutes and grow the heap by some 600 bytes a payment meanwhile.
const prefillPayments = 30_000

// idempotencyMaxKeys bounds the service's idempotency store below what a run sends, so
// that the store reaches its bound in the warm-up and its growth afterwards would be a
// leak; duplicates come seconds after their original, far inside it.
const idempotencyMaxKeys = 20_000

// bounds are the growth each series may show across the judged window (Bound). Memory may
// rise by 10% of its level plus 12 MiB: with the bounded memories filled by the prefill,
// what remains is the Go heap's sawtooth between collections, which swings the heap by up
// to 12 MiB from one sample to the next at 100/s and can tilt a fitted line over a short
// window; a leaked message (about 2 KiB with its headers and context) or goroutine (at
// least 2 KiB of stack) per payment at 100/s grows memory by 12 MiB a minute, past the
// bound within CI's 2-minute window and long before the end of a 30-minute run, which
// also catches a leak ten times slower. Goroutines may rise by 10% plus 20 (in-flight
// handlers and timers come and go with the load); connections not at all (a fitted rise of
// half a connection is one more held for half the window); channels by 2, a publish or a
// declaration briefly holding one.
var bounds = map[string]Bound{
	seriesRSS:         {Rel: 0.10, Abs: 12 << 20},
	seriesHeap:        {Rel: 0.10, Abs: 12 << 20},
	seriesGoroutines:  {Rel: 0.10, Abs: 20},
	seriesConnections: {Abs: 0.5},
	seriesChannels:    {Abs: 2},
}

// settings are the soak's knobs from the environment.
type settings struct {
	duration time.Duration
	rate     float64
	record   bool
}

func loadSettings(t *testing.T) settings {
	t.Helper()
	s := settings{duration: 30 * time.Minute, rate: 100, record: os.Getenv("SOAK_RECORD") == "1"}
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "SOAK_DURATION=%q: want a duration such as 30m", v)
		require.Positive(t, d, "SOAK_DURATION=%q", v)
		s.duration = d
	}
	if v := os.Getenv("SOAK_RATE"); v != "" {
		r, err := strconv.ParseFloat(v, 64)
		require.NoError(t, err, "SOAK_RATE=%q: want requests a second such as 100", v)
		require.Positive(t, r, "SOAK_RATE=%q", v)
		s.rate = r
	}
	return s
}

// warmupOf is the part of a run not judged: a fifth of it, at least a minute, in which
// the service's bounded memories (the idempotency store, the gateway's ledger, the
// delay topology) fill and the Go runtime settles its heap goal.
func warmupOf(d time.Duration) time.Duration { return max(d/5, time.Minute) }

// kind is what a request is meant to do.
type kind int

const (
	kindCharge kind = iota
	kindTransient
	kindPermanent
	kindDuplicate
)

// ledger is what the soak sent and saw.
type ledger struct {
	mu sync.Mutex
	// want maps each payment sent to what it must end as: charged once, or dead-lettered.
	want map[string]kind
	// events counts success events per payment; charges maps charge id to payment.
	events  map[string]int
	charges map[string]string
	// dead counts dead letters per payment.
	dead map[string]int
	// strays are bodies that named no payment of this run.
	strays     []string
	duplicates int // duplicates sent
	sent       int // messages sent, duplicates included
}

func newLedger() *ledger {
	return &ledger{want: map[string]kind{}, events: map[string]int{}, charges: map[string]string{}, dead: map[string]int{}}
}

func (l *ledger) event(body []byte) {
	var ev example_payment.Succeeded
	err := json.Unmarshal(body, &ev)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ours := l.want[ev.PaymentID]; err != nil || !ours {
		l.strays = append(l.strays, "event "+string(body))
		return
	}
	l.events[ev.PaymentID]++
	if prev, seen := l.charges[ev.ChargeID]; seen {
		l.strays = append(l.strays, fmt.Sprintf("charge %s for %s and %s", ev.ChargeID, prev, ev.PaymentID))
	}
	l.charges[ev.ChargeID] = ev.PaymentID
}

func (l *ledger) deadLetter(body []byte) {
	var req struct {
		PaymentID string `json:"payment_id"`
	}
	err := json.Unmarshal(body, &req)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ours := l.want[req.PaymentID]; err != nil || !ours {
		l.strays = append(l.strays, "dead letter "+string(body))
		return
	}
	l.dead[req.PaymentID]++
}

// settled reports whether every payment reached its end.
func (l *ledger) settled() (charged, dead, wantCharged, wantDead int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, k := range l.want {
		if k == kindPermanent {
			wantDead++
			if l.dead[id] > 0 {
				dead++
			}
			continue
		}
		wantCharged++
		if l.events[id] > 0 {
			charged++
		}
	}
	return charged, dead, wantCharged, wantDead
}

// settle waits up to within for every payment sent so far to reach its end, and fails t
// naming a few that did not.
func settle(t *testing.T, l *ledger, within time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		charged, dead, wantCharged, wantDead := l.settled()
		if charged == wantCharged && dead == wantDead {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s after %s stopped, %d of %d payments are charged and %d of %d dead-lettered; unsettled: %s",
				within, what, charged, wantCharged, dead, wantDead, l.unsettled(10))
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// unsettled names up to n payments not at their end yet, with their kind, and counts them
// by kind.
func (l *ledger) unsettled(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	names := map[kind]string{kindCharge: "charge", kindTransient: "transient", kindPermanent: "permanent"}
	byKind := map[string]int{}
	var some []string
	for id, k := range l.want {
		done := l.events[id] > 0
		if k == kindPermanent {
			done = l.dead[id] > 0
		}
		if done {
			continue
		}
		byKind[names[k]]++
		if len(some) < n {
			some = append(some, id+" ("+names[k]+")")
		}
	}
	return fmt.Sprintf("%v, such as %s", byKind, strings.Join(some, ", "))
}

// consume records every delivery of queue with record until ch closes.
func consume(t *testing.T, ch *amqp091.Channel, queue string, record func([]byte), wg *sync.WaitGroup) {
	t.Helper()
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	require.NoError(t, err, "consume %s", queue)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for d := range deliveries {
			record(d.Body)
		}
	}()
}

// service is the payments binary running as its own process.
type service struct {
	cmd     *exec.Cmd
	exited  chan error
	logPath string
	metrics string // http://host:port
}

// startService runs `payments serve` (built without the race detector: the soak measures
// the service's memory, and the detector's shadow memory would swamp it).
func startService(t *testing.T, amqpURL, queue, output string) *service {
	t.Helper()
	bin := testenv.PlainBinary(t, "./cmd/payments")
	metricsAddr := freeAddr(t)
	logPath := filepath.Join(t.TempDir(), "payments.log")
	logs, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(),
		"AMQP_URL="+amqpURL,
		"PAYMENTS_QUEUE="+queue,
		"PAYMENTS_OUTPUT_QUEUE="+output,
		"METRICS_ADDR="+metricsAddr,
		"IDEMPOTENCY_MAX_KEYS="+strconv.Itoa(idempotencyMaxKeys),
		"OTEL_EXPORTER_OTLP_ENDPOINT=",
		"OTEL_TRACES_EXPORTER=none",
		"RABBITMQ_MANAGEMENT_URL=",
	)
	// Logs go to a file, not to the soak's memory: half an hour of them is not small.
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	_ = logs.Close()
	s := &service{cmd: cmd, exited: make(chan error, 1), logPath: logPath, metrics: "http://" + metricsAddr}
	go func() { s.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		s.stop(t)
		if t.Failed() {
			t.Logf("payments service logs (the last 8 KiB of %s):\n%s", logPath, tail(logPath, 8<<10))
		}
	})
	return s
}

// stop asks the service to stop (SIGINT) and waits for it; a service that does not stop
// within 30 s is killed, and either is an error. It returns the exit error.
func (s *service) stop(t *testing.T) error {
	if s.cmd.ProcessState != nil {
		return nil
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-s.exited:
		s.exited <- err // for a later stop
		return err
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		err := <-s.exited
		s.exited <- err
		t.Errorf("the payments service did not stop within 30 s of SIGINT")
		return err
	}
}

// waitReady waits for the service's /readyz.
func (s *service) waitReady(t *testing.T) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	require.Eventually(t, func() bool {
		resp, err := client.Get(s.metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 90*time.Second, 200*time.Millisecond, "the payments service is not ready on %s/readyz; logs:\n%s", s.metrics, tail(s.logPath, 4<<10))
}

// freeAddr returns a loopback address with a port free now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// tail returns the last n bytes of the file at path.
func tail(path string, n int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(read %s: %v)", path, err)
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return string(b)
}

func paymentBody(id, source string) []byte {
	return []byte(fmt.Sprintf(`{"payment_id":%q,"order_id":"ord_%s","amount_cents":1299,"currency":"EUR","source":%q}`, id, id, source))
}

// publisher publishes requests with confirms on a channel of its own.
type publisher struct {
	ch    *amqp091.Channel
	queue string
}

// publish sends bodies and waits for every confirm.
func (p *publisher) publish(ctx context.Context, ids []string, bodies [][]byte) error {
	confirms := make([]*amqp091.DeferredConfirmation, 0, len(bodies))
	for i, body := range bodies {
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", p.queue, true, false, amqp091.Publishing{
			MessageId: ids[i], ContentType: "application/json", DeliveryMode: amqp091.Persistent, Body: body,
		})
		if err != nil {
			return fmt.Errorf("publish %s to %s: %w", ids[i], p.queue, err)
		}
		confirms = append(confirms, dc)
	}
	for i, dc := range confirms {
		ok, err := dc.WaitContext(ctx)
		if err != nil || !ok {
			return fmt.Errorf("publish %s to %s: not confirmed (ack %v, %v)", ids[i], p.queue, ok, err)
		}
	}
	return nil
}

// prefill sends n payments that are charged at once, as fast as the broker confirms them,
// in batches of 500.
func (p *publisher) prefill(ctx context.Context, l *ledger, runID string, n int) error {
	for done := 0; done < n; {
		var ids []string
		var bodies [][]byte
		l.mu.Lock()
		for ; done < n && len(bodies) < 500; done++ {
			id := fmt.Sprintf("soak_%s_pre%06d", runID, done)
			l.want[id] = kindCharge
			l.sent++
			ids, bodies = append(ids, fmt.Sprintf("soak-%s-pre%06d", runID, done)), append(bodies, paymentBody(id, "tok_visa"))
		}
		l.mu.Unlock()
		if err := p.publish(ctx, ids, bodies); err != nil {
			return err
		}
	}
	return nil
}

// sent is a payment the soak may send again as a duplicate.
type sent struct {
	id, body string
	at       time.Time
}

// run publishes the mix at rate until ctx is done, recording each request in l.
func (p *publisher) run(ctx context.Context, l *ledger, runID string, rate float64, rng *rand.Rand) error {
	const tick = 100 * time.Millisecond
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	begin := time.Now()
	var recent []sent // charged-at-once payments, oldest first, for duplicates
	// At a high rate the store's bound is reached sooner: a quarter of it is the limit.
	within := min(duplicateWithin, time.Duration(float64(idempotencyMaxKeys)/(4*rate)*float64(time.Second)))
	n := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		now := time.Now()
		due := int(rate*now.Sub(begin).Seconds()) - n
		var ids []string
		var bodies [][]byte
		l.mu.Lock()
		for ; due > 0; due-- {
			n++
			id := fmt.Sprintf("soak_%s_%07d", runID, n)
			msgID := fmt.Sprintf("soak-%s-%07d", runID, n)
			source, k := "tok_visa", kindCharge
			switch x := rng.Float64(); {
			case x < shareFlaky1:
				source, k = paymentsim.FlakyToken(1), kindTransient
			case x < shareFlaky1+shareFlaky2:
				source, k = paymentsim.FlakyToken(2), kindTransient
			case x < shareFlaky1+shareFlaky2+shareRateLimited:
				source, k = paymentsim.TokenRateLimited, kindTransient
			case x < shareFlaky1+shareFlaky2+shareRateLimited+sharePermanent:
				source, k = paymentsim.TokenInsufficientFunds, kindPermanent
			case x < shareFlaky1+shareFlaky2+shareRateLimited+sharePermanent+shareDuplicate:
				// Payments older than duplicateWithin are no longer candidates: the
				// service's idempotency store is bounded and forgets its oldest keys.
				for len(recent) > 0 && now.Sub(recent[0].at) > within {
					recent = recent[1:]
				}
				if len(recent) > 0 && now.Sub(recent[0].at) >= duplicateAfter {
					// A settled payment, with a message id of its own: a client's second
					// submit, not a redelivery.
					d := recent[0]
					recent = recent[1:]
					ids, bodies = append(ids, msgID), append(bodies, []byte(d.body))
					l.duplicates++
					l.sent++
					continue
				}
			}
			body := paymentBody(id, source)
			l.want[id] = k
			l.sent++
			ids, bodies = append(ids, msgID), append(bodies, body)
			if k == kindCharge {
				recent = append(recent, sent{id: id, body: string(body), at: now})
			}
		}
		l.mu.Unlock()
		if len(bodies) == 0 {
			continue
		}
		// A batch recorded in the ledger is published whole, even when the load ends
		// meanwhile: a half-sent batch would leave payments the soak waits for in vain.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err := p.publish(pctx, ids, bodies)
		cancel()
		if err != nil {
			return err
		}
	}
}

// series is the samples of one metric.
type series struct {
	name    string
	bytes   bool
	samples []Sample
}

func TestSoak(t *testing.T) {
	cfg := loadSettings(t)
	r := testenv.NewRabbit(t)
	warmup := warmupOf(cfg.duration)
	t.Logf("soak: %s at %.0f requests/s on %s, warm-up %s, a sample every %s", cfg.duration, cfg.rate, hostOf(r.URL), warmup, sampleEvery)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	chSource, chErr := findChannelSource(ctx, r.URL)
	if chErr != nil {
		if os.Getenv("SLUICE_REQUIRE_BROKER") == "1" {
			t.Fatalf("cannot count the service's AMQP channels (%v) and SLUICE_REQUIRE_BROKER=1", chErr)
		}
		t.Logf("soak: channels are not sampled: %v", chErr)
	} else {
		t.Logf("soak: channels counted through %s", chSource)
	}

	queue, output := testenv.Name("soak.payments.requested"), testenv.Name("soak.payments.succeeded")
	r.DeleteQueues(queue, topology.DLQ(queue), topology.Archive(queue), output, topology.DLQ(output), topology.IdempotencyJournal(queue))
	svc := startService(t, r.URL, queue, output)
	svc.waitReady(t)

	port := 5672
	if p := portOf(r.URL); p != 0 {
		port = p
	}
	smp := &sampler{pid: svc.cmd.Process.Pid, metricsURL: svc.metrics + "/metrics", brokerPort: port, channels: chSource,
		http: &http.Client{Timeout: 5 * time.Second}}

	l := newLedger()
	var consumers sync.WaitGroup
	consCh, err := r.Conn.Channel()
	require.NoError(t, err)
	consume(t, consCh, output, l.event, &consumers)
	consume(t, consCh, topology.DLQ(queue), l.deadLetter, &consumers)
	defer func() {
		_ = consCh.Close()
		consumers.Wait()
	}()

	pubCh, err := r.Conn.Channel()
	require.NoError(t, err)
	defer pubCh.Close()
	require.NoError(t, pubCh.Confirm(false))
	pub := &publisher{ch: pubCh, queue: queue}

	runID := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	prefillBegin := time.Now()
	require.NoError(t, pub.prefill(ctx, l, runID, prefillPayments), "prefill")
	settle(t, l, 3*time.Minute, "the prefill")
	t.Logf("soak: prefilled %d payments in %s", prefillPayments, time.Since(prefillBegin).Round(100*time.Millisecond))

	// Sampling and publishing run side by side for the soak's duration.
	l.mu.Lock()
	sentBefore := l.sent
	l.mu.Unlock()
	begin := time.Now()
	all := map[string]*series{}
	order := []string{seriesRSS, seriesHeap, seriesGoroutines, seriesConnections, seriesChannels}
	for _, name := range order {
		all[name] = &series{name: name, bytes: name == seriesRSS || name == seriesHeap}
	}
	var sampleErrs []error
	rounds := 0
	take := func() {
		rounds++
		rd, err := smp.read(ctx)
		if err != nil {
			sampleErrs = append(sampleErrs, fmt.Errorf("sample at %s: %w", time.Since(begin).Round(time.Second), err))
		}
		at := time.Since(begin)
		for name, v := range rd {
			all[name].samples = append(all[name].samples, Sample{At: at, V: v})
		}
	}
	loadCtx, stopLoad := context.WithTimeout(ctx, cfg.duration)
	defer stopLoad()
	pubErr := make(chan error, 1)
	go func() {
		pubErr <- pub.run(loadCtx, l, runID, cfg.rate, rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 38)))
	}()
	take()
	ticker := time.NewTicker(sampleEvery)
	lastProgress := time.Now()
	producerDone := false
sampling:
	for {
		select {
		case <-loadCtx.Done():
			break sampling
		case err := <-pubErr:
			producerDone = true
			stopLoad()
			require.NoError(t, err, "the soak's producer stopped")
			break sampling
		case <-ticker.C:
			take()
			if time.Since(lastProgress) >= time.Minute {
				lastProgress = time.Now()
				charged, dead, wantCharged, wantDead := l.settled()
				t.Logf("soak: %s: %s; charged %d of %d, dead-lettered %d of %d", time.Since(begin).Round(time.Second),
					latest(all, order), charged, wantCharged, dead, wantDead)
			}
		}
	}
	ticker.Stop()
	take() // the end of the load
	elapsed := time.Since(begin)
	if !producerDone {
		select {
		case err := <-pubErr:
			require.NoError(t, err, "the soak's producer failed")
		case <-time.After(30 * time.Second):
			t.Fatal("the soak's producer did not stop within 30 s")
		}
	}
	// A round that missed a figure (a slow rabbitmqctl on a busy machine) costs a sample;
	// more than a tenth of the rounds missing one leaves too little to judge.
	for _, err := range sampleErrs {
		t.Logf("soak: %v", err)
	}
	assert.LessOrEqual(t, len(sampleErrs), max(1, rounds/10), "rounds that missed a figure, of %d", rounds)

	// Every request reaches its end once the load stops: the retries are seconds long.
	settle(t, l, 3*time.Minute, "the load")
	time.Sleep(2 * time.Second) // a second charge or dead letter would show by now
	hits := 0.0
	if text, err := smp.scrape(ctx); assert.NoError(t, err) {
		hits, _ = metricSum(text, "sluice_idempotency_hits_total")
	}
	require.NoError(t, svc.stop(t), "the payments service exited with an error; logs:\n%s", tail(svc.logPath, 8<<10))

	// Correctness: every payment charged exactly once or dead-lettered exactly once, every
	// duplicate acknowledged without a charge, nothing left in the queues.
	l.mu.Lock()
	var doubleCharged, doubleDead, chargedDeclined []string
	for id, k := range l.want {
		if k == kindPermanent {
			if l.events[id] > 0 {
				chargedDeclined = append(chargedDeclined, id)
			}
			if l.dead[id] > 1 {
				doubleDead = append(doubleDead, id)
			}
			continue
		}
		if l.events[id] > 1 {
			doubleCharged = append(doubleCharged, id)
		}
	}
	summary := fmt.Sprintf("%d requests sent (%d in the prefill, then %.0f/s achieved), %d distinct payments: %d charged once, %d dead-lettered (insufficient funds), %d duplicates acknowledged without a charge",
		l.sent, sentBefore, float64(l.sent-sentBefore)/elapsed.Seconds(), len(l.want), len(l.charges), len(l.dead), int(hits))
	assert.Empty(t, doubleCharged, "payments charged more than once")
	assert.Empty(t, doubleDead, "payments dead-lettered more than once")
	assert.Empty(t, chargedDeclined, "declined payments charged")
	assert.Empty(t, l.strays, "events or dead letters of no payment of this run (or a charge id twice)")
	assert.Equal(t, float64(l.duplicates), hits, "duplicates sent vs the service's sluice_idempotency_hits_total")
	l.mu.Unlock()
	for _, q := range []string{queue, output, topology.DLQ(queue)} {
		assert.Zero(t, r.Count(q), "messages left in %s after the soak", q)
	}

	// Growth: judge each series after the warm-up.
	var rows []row
	for _, name := range order {
		s := all[name]
		rw := row{name: name, bytes: s.bytes, bound: bounds[name]}
		if len(s.samples) == 0 {
			rw.missing = "no source (see the log)"
			if chErr != nil {
				rw.missing = "neither the management API nor rabbitmqctl answers"
			}
			rows = append(rows, rw)
			continue
		}
		rw.verdict = Judge(s.samples, warmup, rw.bound)
		rows = append(rows, rw)
		if rw.verdict.Leak {
			t.Errorf("%s keeps growing: %s; samples: %s", name, rw.verdict.Reason, samplesText(s))
		} else {
			t.Logf("soak: %s: %s", name, rw.verdict.Reason)
		}
	}
	tbl := table(rows)
	head := fmt.Sprintf("%s at %.0f requests/s (%s), warm-up %s, sampled every %s, against RabbitMQ %s; %s, %d CPUs.",
		elapsed.Round(time.Second), cfg.rate, time.Now().UTC().Format("2006-01-02 15:04 UTC"), warmup, sampleEvery, brokerVersion(r), runtime.Version(), runtime.NumCPU())
	t.Logf("soak: %s\n%s\n%s", head, summary, tbl)
	for _, name := range order {
		t.Logf("soak: %s samples: %s", name, samplesText(all[name]))
	}
	if cfg.record {
		if t.Failed() {
			t.Log("soak: SOAK_RECORD=1 but the run failed: BENCHMARKS.md left as it was")
			return
		}
		path := filepath.Join(testenv.ModuleRoot(t), "BENCHMARKS.md")
		require.NoError(t, recordSection(path, soakSection(head, summary, tbl)))
		t.Logf("soak: the table is in %s, section %q", path, soakHeading)
	}
}

// soakSection is BENCHMARKS.md's "## Soak" section for a run.
func soakSection(head, summary, tbl string) string {
	// ¦ stands for a backquote, which a raw string cannot hold.
	text := strings.ReplaceAll(`## Soak

¦make soak¦ (issue 38, ¦test/soak¦) runs the payment service (¦payments serve¦, its own process,
built without the race detector) against RabbitMQ (¦AMQP_URL¦) for ¦SOAK_DURATION¦ (default 30m;
CI runs 3m in ¦make test¦'s RabbitMQ 3.10 part) at ¦SOAK_RATE¦ requests a second (default 100):
20% fail transiently and recover on a retry (¦tok_flaky_1¦ 10%, ¦tok_flaky_2¦ 7%,
¦tok_rate_limited¦ 3%), 3% are declined for good and dead-lettered, 5% are duplicates of a
payment settled 3 to 30 s before (inside what the bounded idempotency store remembers). Before
the clock starts it sends 30,000 payments as fast as the service takes them, filling the
service's bounded memories (the simulated gateway's ledger, 20,000 payments, and the
idempotency store, bounded at 20,000 keys with ¦IDEMPOTENCY_MAX_KEYS¦), so that even a
3-minute run judges the steady state rather than their filling. Every 10 s it samples the
service's RSS (¦/proc¦), Go heap in use and goroutines (its ¦/metrics¦), its established
connections to the broker (its own sockets) and the channels the broker lists on them
(management API, else ¦rabbitmqctl¦).

A series fails the run when, after the warm-up (a fifth of the run, at least a minute), the
least-squares line through its samples rises across the rest of the run by more than its bound
and the last third of those samples sits above the first third by more than half the bound:
growth that persisted, not a GC sawtooth or a late spike. Bounds: memory 10% of its level plus
12 MiB (the heap's sawtooth swings it by up to 12 MiB between samples; a leaked message or
goroutine per payment at 100/s is 12 MiB a minute), goroutines 10% plus 20, connections none,
channels 2. The run also fails unless every payment is charged exactly once or dead-lettered
exactly once, every duplicate is acknowledged without a charge
(¦sluice_idempotency_hits_total¦), and the queues are empty at the end. In the table, start is
the first sample after the prefill, peak the highest, end the last under load.

¦¦¦sh
make soak                                        # 30 minutes at 100/s
make soak SOAK_DURATION=10m SOAK_RECORD=1        # 10 minutes, the table below replaced
¦¦¦

`, "¦", "`")
	return text + "Measured: " + head + "\n" + summary + ".\n\n" + tbl
}

// latest is the last reading of each series, for the progress lines.
func latest(all map[string]*series, order []string) string {
	var parts []string
	for _, name := range order {
		s := all[name]
		if len(s.samples) == 0 {
			continue
		}
		v := s.samples[len(s.samples)-1].V
		if s.bytes {
			parts = append(parts, fmt.Sprintf("%s %.1f MiB", name, v/(1<<20)))
		} else {
			parts = append(parts, fmt.Sprintf("%s %.0f", name, v))
		}
	}
	return strings.Join(parts, ", ")
}

// samplesText lists a series' samples compactly, for a failure message and the log.
func samplesText(s *series) string {
	var parts []string
	for _, x := range s.samples {
		if s.bytes {
			parts = append(parts, fmt.Sprintf("%.1f", x.V/(1<<20)))
		} else {
			parts = append(parts, fmt.Sprintf("%.0f", x.V))
		}
	}
	unit := ""
	if s.bytes {
		unit = " (MiB)"
	}
	return strings.Join(parts, " ") + unit
}

// brokerVersion is the version the broker announced to the plain client.
func brokerVersion(r *testenv.Rabbit) string {
	if v, ok := r.Conn.Properties["version"].(string); ok {
		return v
	}
	return "(version unknown)"
}

// hostOf is the host:port of an AMQP URL, without its credentials.
func hostOf(amqpURL string) string {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return "(unparsable AMQP_URL)"
	}
	return u.Host
}

// portOf is the port of an AMQP URL, or 0 when it names none.
func portOf(amqpURL string) int {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return 0
	}
	p, _ := strconv.Atoi(u.Port())
	return p
}
