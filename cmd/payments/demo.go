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

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/middleware/poison"
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
	reqs       []example_payment.DemoRequest
}

func newTally(reqs []example_payment.DemoRequest, ids []string) *tally {
	t := &tally{
		byID: map[string]int{}, succeeded: map[string]int{}, attempts: map[string]int{},
		dead: map[string]string{}, retrying: map[string]bool{}, settledIDs: map[string]bool{}, reqs: reqs,
	}
	for i, id := range ids {
		t.byID[id] = i
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

func (t *tally) deadLetter(e poison.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ours := t.byID[e.MessageID]; !ours {
		return
	}
	t.dead[e.MessageID] = e.ErrorType
	delete(t.retrying, e.MessageID)
	t.settledIDs[e.MessageID] = true
}

func (t *tally) duplicate(string) {
	t.mu.Lock()
	t.duplicates++
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

func expectations(reqs []example_payment.DemoRequest, maxAttempts int) expected {
	e := expected{deadByType: map[string]int{}, attempts: map[string]int{}}
	for _, r := range reqs {
		x := r.ExpectWithin(maxAttempts)
		switch x.Outcome {
		case example_payment.ExpectSucceeded:
			e.succeeded++
			e.attempts[r.PaymentID] = x.Attempts
		case example_payment.ExpectDeadLettered:
			e.dead++
			e.deadByType[x.ErrorType]++
		case example_payment.ExpectDuplicate:
			e.duplicates++
		}
	}
	return e
}

func demo(ctx context.Context, cfg config, args []string) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	n := fs.Int("n", 200, "number of requests to publish")
	seed := fs.Int64("seed", time.Now().UnixNano()%1_000_000, "seed of the request mix (part of every payment id)")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up waiting for the mix to settle after this long")
	verbose := fs.Bool("v", false, "show the service's logs")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *n < example_payment.DemoMixMinimum {
		fmt.Fprintf(os.Stderr, "payments demo: -n %d is below %d, the smallest mix that covers every token\n", *n, example_payment.DemoMixMinimum)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if *verbose {
		logger = newLogger(slog.LevelInfo)
	}
	reqs := example_payment.DemoMix(*n, *seed)
	ids := make([]string, len(reqs))
	for i := range reqs {
		ids[i] = fmt.Sprintf("demo-%d-%04d", *seed, i)
	}
	t := newTally(reqs, ids)
	maxAttempts := cfg.retry.MaxRetries + 1
	if cfg.retry.MaxRetries < 0 {
		maxAttempts = 1
	}
	want := expectations(reqs, maxAttempts)

	svc, err := newService(ctx, cfg, logger, hooks{onRetry: t.retry, onDeadLetter: t.deadLetter, onDuplicate: t.duplicate})
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments demo:", err)
		return 1
	}
	defer svc.close()
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	runErr := make(chan error, 1)
	go func() { runErr <- svc.stack.Run(runCtx) }()
	select {
	case <-svc.stack.Running():
	case err := <-runErr:
		fmt.Fprintln(os.Stderr, "payments demo: the service did not start:", err)
		return 1
	}

	// Watch the success queue for this run's events.
	sub := svc.broker.Subscriber(4, 32)
	events, err := sub.Subscribe(runCtx, cfg.output)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments demo: watch", cfg.output+":", err)
		return 1
	}
	go func() {
		for m := range events {
			var ev example_payment.Succeeded
			if json.Unmarshal(m.Payload, &ev) == nil && t.success(ev) {
				m.Ack()
				continue
			}
			m.Nack() // another run's event: leave it for whoever waits for it
		}
	}()

	fmt.Printf("sluice payments demo: %d requests (seed %d) on the %s broker, up to %d attempts each\n",
		len(reqs), *seed, svc.broker.Name(), maxAttempts)
	pub, closePub, err := producerPublisher(ctx, cfg, svc.broker, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments demo:", err)
		return 1
	}
	defer closePub()
	for i, r := range reqs {
		m := message.NewMessage(ids[i], r.Body)
		m.Metadata.Set(amqp.MetadataContentType, example_payment.ContentTypeJSON)
		if err := publishRequest(ctx, svc.broker, pub, cfg, m); err != nil {
			fmt.Fprintf(os.Stderr, "\npayments demo: publish request %d: %v\n", i, err)
			return 1
		}
	}

	deadline := time.After(*timeout)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	tty := isTerminal(os.Stdout)
	for settled := false; !settled; {
		select {
		case <-ctx.Done():
			fmt.Println("\ninterrupted")
			return 1
		case err := <-runErr:
			fmt.Fprintln(os.Stderr, "\npayments demo: the service stopped:", err)
			return 1
		case <-deadline:
			fmt.Printf("\ngave up after %s: not every request settled\n", *timeout)
			settled = true
		case <-tick.C:
			s := t.snapshot()
			line := fmt.Sprintf("published %d  succeeded %d  retrying %d  dead-lettered %d  duplicates absorbed %d",
				len(reqs), s.succeeded, s.retrying, s.dead, s.duplicates)
			if tty {
				fmt.Printf("\r%s   ", line)
			} else {
				fmt.Println(line)
			}
			settled = s.succeeded >= want.succeeded && s.dead >= want.dead && s.duplicates >= want.duplicates
		}
	}
	if tty {
		fmt.Println()
	}
	// Give late duplicates or double charges a moment to show up before judging.
	time.Sleep(300 * time.Millisecond)
	ok := t.printSummary(os.Stdout, want)
	cancelRun()
	if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "payments demo: service:", err)
	}
	_ = sub.Close()
	if !ok {
		return 1
	}
	return 0
}

type snapshot struct{ succeeded, retrying, dead, duplicates, doubleCharges, wrongAttempts int }

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
	wrongAttempts := 0
	for pid, a := range t.attempts {
		if exp, ok := want.attempts[pid]; ok && exp != a {
			wrongAttempts++
		}
	}
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
	ok = row("  with the expected attempt count", want.succeeded, want.succeeded-wrongAttempts) && ok
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
	if ok {
		fmt.Fprintln(w, "every request settled as the contract says")
	} else {
		fmt.Fprintln(w, "MISMATCH: see the rows marked above")
	}
	return ok
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0 && !strings.EqualFold(os.Getenv("TERM"), "dumb")
}
