package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/disposition"
	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/demo/paymentdemo"
	"github.com/sluice-go/sluice/internal/demo/paymentsim"
	"github.com/sluice-go/sluice/middleware/retry"
)

// tally is what the demo has seen, fed by the stack's hooks and the success queue.
type tally struct {
	mu         sync.Mutex
	byID       map[string]int    // message id → request index
	succeeded  map[string]int    // payment id → success events
	attempts   map[string]int    // payment id → attempts of its (first) event
	dead       map[string]string // message id → error type
	retrying   map[string]bool   // message ids retried and not yet settled
	duplicates int
	settledIDs map[string]bool
	reqs       []paymentdemo.Request
	payments   map[string]bool // this run's payment ids
	leftovers  int             // events of earlier runs found in the success queue
}

// progressEvery is the shortest time between two progress lines when the output is not a
// terminal (a pipe, a CI log): a line per change would flood it.
const progressEvery = 5 * time.Second

func newTally(reqs []paymentdemo.Request, ids []string) *tally {
	t := &tally{
		byID: map[string]int{}, succeeded: map[string]int{}, attempts: map[string]int{},
		dead: map[string]string{}, retrying: map[string]bool{}, settledIDs: map[string]bool{}, reqs: reqs,
		payments: map[string]bool{},
	}
	for i, id := range ids {
		t.byID[id] = i
		t.payments[reqs[i].PaymentID] = true
	}
	return t
}

func (t *tally) retry(e retry.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ours := t.byID[e.MessageID]; ours && !t.settledIDs[e.MessageID] {
		t.retrying[e.MessageID] = true
	}
}

func (t *tally) deadLetter(e disposition.Outcome) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ours := t.byID[e.MessageID]; !ours {
		return
	}
	t.dead[e.MessageID] = e.ErrorType
	delete(t.retrying, e.MessageID)
	t.settledIDs[e.MessageID] = true
}

func (t *tally) duplicate(key string) {
	t.mu.Lock()
	if t.payments[key] {
		t.duplicates++
	}
	t.mu.Unlock()
}

func (t *tally) leftover() {
	t.mu.Lock()
	t.leftovers++
	t.mu.Unlock()
}

func (t *tally) success(ev example_payment.Succeeded) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	ours := false
	for id, i := range t.byID {
		if t.reqs[i].PaymentID == ev.PaymentID {
			ours = true
			delete(t.retrying, id)
			t.settledIDs[id] = true
		}
	}
	if !ours {
		return false
	}
	if t.succeeded[ev.PaymentID] == 0 {
		t.attempts[ev.PaymentID] = ev.Attempts
	}
	t.succeeded[ev.PaymentID]++
	return true
}

// expected sums the mix's expectations for a retry limit.
type expected struct {
	succeeded, dead, duplicates int
	deadByType                  map[string]int
	attempts                    map[string]int // payment id → attempts of its success
}

func expectations(reqs []paymentdemo.Request, maxAttempts int) expected {
	e := expected{deadByType: map[string]int{}, attempts: map[string]int{}}
	for _, r := range reqs {
		x := r.ExpectWithin(maxAttempts)
		switch x.Outcome {
		case paymentdemo.ExpectSucceeded:
			e.succeeded++
			e.attempts[r.PaymentID] = x.Attempts
		case paymentdemo.ExpectDeadLettered:
			e.dead++
			e.deadByType[x.ErrorType]++
		case paymentdemo.ExpectDuplicate:
			e.duplicates++
		}
	}
	return e
}

// demo runs the demo, writing what it shows to out (its errors go to standard error).
func demo(ctx context.Context, cfg config, args []string, out io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	n := fs.Int("n", 200, "number of requests to publish")
	seed := fs.Int64("seed", time.Now().UnixNano()%1_000_000, "seed of the request mix (part of every payment id)")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up waiting for the mix to settle after this long")
	verbose := fs.Bool("v", false, "show the service's logs")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *n < paymentdemo.MixMinimum {
		fmt.Fprintf(os.Stderr, "payments demo: -n %d is below %d, the smallest mix that covers every token\n", *n, paymentdemo.MixMinimum)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if *verbose {
		logger = newLogger(slog.LevelInfo)
	}
	reqs := paymentdemo.Mix(*n, *seed)
	// The run id tells this run's messages and events from an earlier run's, even one
	// with the same seed: it is the requests' correlation id, which the handler copies to
	// its events, and part of every message id.
	runID := "payments-demo-" + watermill.NewShortUUID()
	ids := make([]string, len(reqs))
	for i := range reqs {
		ids[i] = fmt.Sprintf("%s-%04d", runID, i)
	}
	t := newTally(reqs, ids)
	maxAttempts := cfg.retry.MaxRetries + 1
	if cfg.retry.MaxRetries < 0 {
		maxAttempts = 1
	}
	want := expectations(reqs, maxAttempts)

	rec := tracetest.NewSpanRecorder()
	svc, err := newService(ctx, cfg, logger, hooks{onRetry: t.retry, onDeadLetter: t.deadLetter, onDuplicate: t.duplicate, spans: rec})
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments demo:", err)
		return 1
	}
	defer svc.close()
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	runErr := make(chan error, 1)
	// Through the service's run, as serve does: /readyz (METRICS_ADDR) says ready while
	// the demo consumes, and names a breaker's pause.
	go func() { runErr <- svc.run(runCtx) }()
	select {
	case <-svc.stack.Running():
	case err := <-runErr:
		fmt.Fprintln(os.Stderr, "payments demo: the service did not start:", err)
		return 1
	}

	// Watch the success queue (or exchange) for this run's events.
	watched, err := watchSuccesses(runCtx, svc.broker, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments demo: watch", cfg.outputExchange+":", err)
		return 1
	}
	sub := svc.broker.Subscriber(broker.SubscribeOptions{Concurrency: 4, Prefetch: 32})
	events, err := sub.Subscribe(runCtx, watched)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments demo: watch", watched+":", err)
		return 1
	}
	go func() {
		for m := range events {
			var ev example_payment.Succeeded
			if middleware.MessageCorrelationID(m) == runID && json.Unmarshal(m.Payload, &ev) == nil && t.success(ev) {
				m.Ack()
				continue
			}
			// An earlier run's event (an interrupted demo, a payments serve). A nack would
			// requeue it at the head of the queue, where it would come back before this
			// run's events for ever: it is taken out and counted instead.
			t.leftover()
			m.Ack()
		}
	}()

	fmt.Fprintf(out, "sluice payments demo: %d requests on the %s broker, up to %d attempts each\n",
		len(reqs), svc.broker.Name(), maxAttempts)
	fmt.Fprintf(out, "seed %d, run %s\n", *seed, runID)
	if addr := svc.telemetry.MetricsAddr(); addr != "" {
		fmt.Fprintf(out, "metrics on http://%s/metrics while it runs\n", addr)
	}
	pub, closePub, err := producerPublisher(ctx, cfg, svc.broker, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments demo:", err)
		return 1
	}
	defer closePub()
	for i, r := range reqs {
		m := message.NewMessage(ids[i], r.Body)
		m.Metadata.Set(amqp.MetadataContentType, paymentsim.ContentTypeJSON)
		middleware.SetCorrelationID(runID, m)
		if err := publishRequest(ctx, svc.broker, pub, cfg, m); err != nil {
			fmt.Fprintf(os.Stderr, "\npayments demo: publish request %d: %v\n", i, err)
			return 1
		}
	}

	start := time.Now()
	deadline := time.After(*timeout)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	tty := isTerminal(out)
	var lastState, lastLine string
	var lastPrint time.Time
	for settled := false; !settled; {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "\ninterrupted")
			return 1
		case err := <-runErr:
			fmt.Fprintln(os.Stderr, "\npayments demo: the service stopped:", err)
			return 1
		case <-deadline:
			fmt.Fprintf(out, "\ngave up after %s, still %s\n", *timeout, waitingFor(want, t.snapshot()))
			settled = true
		case <-tick.C:
			s := t.snapshot()
			state := progress(s, want)
			settled = s.succeeded >= want.succeeded && s.dead >= want.dead && s.duplicates >= want.duplicates
			// On change only; into a pipe or a log at most every progressEvery, and the
			// last state always.
			if state != lastState && (tty || settled || lastPrint.IsZero() || time.Since(lastPrint) >= progressEvery) {
				line := fmt.Sprintf("%5.1fs  %s", time.Since(start).Seconds(), state)
				if tty {
					// Over the last line, blanking what a longer one left.
					fmt.Fprintf(out, "\r%s%s", line, strings.Repeat(" ", max(0, len(lastLine)-len(line))))
				} else {
					fmt.Fprintln(out, line)
				}
				lastState, lastLine, lastPrint = state, line, time.Now()
			}
		}
	}
	if tty {
		fmt.Fprintln(out)
	}
	fmt.Fprintf(out, "settled in %.1fs\n", time.Since(start).Seconds())
	// Give late duplicates or double charges a moment to show up before judging.
	time.Sleep(300 * time.Millisecond)
	ok := t.printSummary(out, want)
	cancelRun()
	if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "payments demo: service:", err)
	}
	_ = sub.Close()
	// The stack has stopped: every span of the run has ended.
	shown := t.showcase(reqs, ids, want)
	printTraces(out, rec.Ended(), shown)
	printClosing(out, closing{
		broker:      svc.broker.Name(),
		queue:       cfg.queue,
		dead:        t.snapshot().dead,
		exporter:    svc.telemetry.TracesExporter(),
		metricsAddr: svc.telemetry.MetricsAddr(),
		jaegerUI:    jaegerUIURL(),
		traces:      shown.traceIDs(rec.Ended()),
	})
	if !ok {
		return 1
	}
	return 0
}

type snapshot struct{ succeeded, retrying, dead, duplicates, doubleCharges int }

func (t *tally) snapshot() snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := snapshot{succeeded: len(t.succeeded), retrying: len(t.retrying), dead: len(t.dead), duplicates: t.duplicates}
	for _, c := range t.succeeded {
		if c > 1 {
			s.doubleCharges += c - 1
		}
	}
	return s
}

// printSummary prints expected beside observed per outcome and reports whether they match.
func (t *tally) printSummary(w io.Writer, want expected) bool {
	s := t.snapshot()
	t.mu.Lock()
	deadByType := map[string]int{}
	for _, typ := range t.dead {
		deadByType[typ]++
	}
	// Counted from what arrived: a run that saw no event must not match this row.
	rightAttempts := 0
	for pid, a := range t.attempts {
		if exp, ok := want.attempts[pid]; ok && exp == a {
			rightAttempts++
		}
	}
	leftovers := t.leftovers
	t.mu.Unlock()

	fmt.Fprintf(w, "\n%-36s %9s %9s\n", "outcome", "expected", "observed")
	row := func(name string, exp, got int) bool {
		mark := ""
		if exp != got {
			mark = "   <-- mismatch"
		}
		fmt.Fprintf(w, "%-36s %9d %9d%s\n", name, exp, got, mark)
		return exp == got
	}
	ok := row("succeeded", want.succeeded, s.succeeded)
	ok = row("  with the expected attempt count", want.succeeded, rightAttempts) && ok
	ok = row("dead-lettered", want.dead, s.dead) && ok
	types := map[string]bool{}
	for k := range want.deadByType {
		types[k] = true
	}
	for k := range deadByType {
		types[k] = true
	}
	var names []string
	for k := range types {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		ok = row("  "+k, want.deadByType[k], deadByType[k]) && ok
	}
	ok = row("duplicates absorbed", want.duplicates, s.duplicates) && ok
	ok = row("double charges", 0, s.doubleCharges) && ok
	if leftovers > 0 {
		fmt.Fprintf(w, "(%d events of earlier runs were in the success queue: taken out, not counted)\n", leftovers)
	}
	if ok {
		fmt.Fprintln(w, "every request settled as the contract says")
	} else {
		fmt.Fprintln(w, "MISMATCH: see the rows marked above")
	}
	return ok
}

// waitingFor says which outcomes the demo still waits for.
func waitingFor(want expected, s snapshot) string {
	var parts []string
	add := func(n int, what string) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(want.succeeded-s.succeeded, "successes")
	add(want.dead-s.dead, "dead letters")
	add(want.duplicates-s.duplicates, "duplicates")
	if len(parts) == 0 {
		return "waiting for nothing"
	}
	return "waiting for " + strings.Join(parts, ", ")
}

// progress is the progress line's state: each outcome seen of those expected, and the
// requests between attempts. Narrow enough for an 80-column terminal; a mix of more than
// a few thousand requests gets the short labels.
func progress(s snapshot, want expected) string {
	line := fmt.Sprintf("succeeded %d/%d  dead-lettered %d/%d  duplicates %d/%d  retrying %d",
		s.succeeded, want.succeeded, s.dead, want.dead, s.duplicates, want.duplicates, s.retrying)
	if len(line) > progressWidth {
		line = fmt.Sprintf("ok %d/%d  dead %d/%d  dup %d/%d  retrying %d",
			s.succeeded, want.succeeded, s.dead, want.dead, s.duplicates, want.duplicates, s.retrying)
	}
	return line
}

// progressWidth is the longest state progress writes with its long labels: with the
// elapsed time before it, the line stays within 80 columns.
const progressWidth = 80 - len("999.9s  ") - 1

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0 && !strings.EqualFold(os.Getenv("TERM"), "dumb")
}
