package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/sluice-go/sluice/cmd/sluice/internal/retryview"
	"github.com/sluice-go/sluice/policy"
)

const policyAbout = `Prints the running service's retry decision matrix: for each handler its queue,
what each error class leads to, the delay schedule (every retry's delay and jitter
range), the maximum attempts, the retry budget, the circuit breaker and what it does
while open, the idempotency key, the dead-letter queue and archive, and the learned
retry policy's current view of each error type.

It is read from the service's endpoint SLUICE_SERVICE_URL` + policyPath + `
(SLUICE_SERVICE_URL defaults to ` + defaultServiceURL + `: the service's METRICS_ADDR).
--markdown prints it as Markdown, for a runbook.`

// policyReport is what sluice policy prints with --json.
type policyReport = retryview.Policy

func runPolicy(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("sluice policy", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	handler := fs.String("handler", "", "show handler `H` only")
	asJSON := fs.Bool("json", false, "print JSON")
	asMarkdown := fs.Bool("markdown", false, "print Markdown, for a runbook")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: sluice policy [--handler H] [--markdown | --json]\n\n%s\n\nFlags:\n", policyAbout)
		printFlags(w, fs, nil)
		fmt.Fprintln(w, "\nExit codes: 0 ok, 1 service unreachable or failing, 2 usage error, 3 no such handler.")
	}
	pos, err := parseInterleaved(e, fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usageErrorf("sluice policy: unexpected arguments %q (see 'sluice policy -h')", pos)
	case *asJSON && *asMarkdown:
		return usageErrorf("sluice policy: give --json or --markdown, not both")
	}
	ctx, cancel := context.WithTimeout(ctx, serviceTimeout)
	defer cancel()
	client := newHTTPClient()
	defer client.CloseIdleConnections()
	out, err := retrySource(e, client).Policy(ctx)
	if err != nil {
		return cliErr(err, serviceURL(e))
	}
	if *handler != "" {
		out.Handlers = slices.DeleteFunc(out.Handlers, func(h policy.HandlerDescription) bool { return h.Name != *handler })
		if len(out.Handlers) == 0 {
			return notFound(fmt.Errorf("sluice policy: the service at %s has no handler %q", out.URL, *handler))
		}
	}
	switch {
	case *asJSON:
		return writeJSON(e, out)
	case *asMarkdown:
		md := out.Markdown()
		// The source goes under the title, as a runbook quotes where it came from.
		title, rest, _ := strings.Cut(md, "\n")
		_, err := fmt.Fprintf(e.stdout, "%s\n\nRead from the service at %s.\n%s", title, out.URL, rest)
		return err
	}
	return printPolicy(e.stdout, out)
}

// printPolicy writes d for a terminal: a block per handler.
func printPolicy(w io.Writer, d policyReport) error {
	fmt.Fprintf(w, "Retry policy of the service at %s.\n", d.URL)
	if len(d.Handlers) == 0 {
		fmt.Fprintln(w, "\nNo handlers are registered.")
	}
	for _, h := range d.Handlers {
		p := h.Retry
		fmt.Fprintf(w, "\nHandler %s\n", h.Name)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		kv := func(k, v string) { fmt.Fprintf(tw, "  %s\t%s\n", k, v) }
		kv("queue", orDash(h.Queue))
		if h.Partitions > 0 {
			kv("partitions", fmt.Sprintf("%d: %s", h.Partitions, strings.Join(h.Consumes, ", ")))
		}
		kv("dead-letter queue", orDash(h.DeadLetterQueue))
		kv("archive", orDash(h.Archive))
		kv("handler timeout", fmt.Sprintf("%s, abandoned %s later (grace); at most %d abandoned still running, then paused", h.HandlerTimeout, h.AbandonGrace, h.MaxAbandoned))
		kv("settle bound", h.SettleText())
		kv("max attempts", fmt.Sprintf("%d (%d retries), within %s of the first failure", p.MaxAttempts, p.MaxRetries, p.MaxTotalAge))
		kv("backoff", fmt.Sprintf("%s × %g up to %s, jitter ±%g%%", p.InitialDelay, p.Multiplier, p.MaxDelay, p.Jitter*100))
		for _, r := range p.Schedule {
			kv(fmt.Sprintf("  retry %d", r.Retry), fmt.Sprintf("%s (%s – %s), attempt %d at +%s", r.Delay, r.MinDelay, r.MaxDelay, r.Attempt, r.Elapsed))
		}
		if b := p.Budget; b != nil {
			v := fmt.Sprintf("%g of first attempts over %s (at least %g/s); when spent: %s", b.Ratio, b.Window, b.MinRetriesPerSecond, b.WhenSpent)
			if b.Left != nil {
				v += fmt.Sprintf("; %s has %.1f left", b.Dependency, *b.Left)
			}
			kv("retry budget", v)
		} else {
			kv("retry budget", "none")
		}
		if b := h.Breaker; b != nil {
			v := "while open: " + b.WhileOpen
			if b.Dependency != "" {
				v = fmt.Sprintf("%s (%s), open %s then %d half-open probes; %s", b.Dependency, b.State, b.OpenTimeout, b.HalfOpenProbes, v)
			}
			kv("breaker", v)
		} else {
			kv("breaker", "none")
		}
		if id := h.Idempotency; id != nil {
			v := "key: " + id.Key
			if id.Journal != "" {
				v += "; journal " + id.Journal
			}
			kv("idempotency", v)
		} else {
			kv("idempotency", "none")
		}
		if l := p.Learned; l != nil {
			kv("learned policy", fmt.Sprintf("stops below %g%% recovered after %d ended messages; explores %g%%", l.UnlikelyBelow*100, l.MinEvidence, l.Explore*100))
			for _, v := range h.Learned {
				why := v.Reason
				if v.Evidence != "" {
					why = v.Evidence
				}
				kv("  "+v.ErrorType, (v.Verdict).Text()+": "+why)
			}
		} else {
			kv("learned policy", "none")
		}
		kv("error classes", "")
		for _, c := range h.ErrorClasses {
			kv("  "+c.Class, c.Action)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, n := range d.Notes {
		fmt.Fprintf(w, "\nNote: %s\n", n)
	}
	return nil
}
