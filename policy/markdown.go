package policy

import (
	"fmt"
	"strings"
)

// Markdown renders the description for a runbook: a section per handler with a table of
// its settings, one of its error classes and their actions, one of its delay schedule,
// and one of the learned policy's current view.
func (d Description) Markdown() string {
	var b strings.Builder
	b.WriteString("# Retry decision matrix\n")
	if len(d.Handlers) == 0 {
		b.WriteString("\nNo handlers are registered.\n")
	}
	for _, h := range d.Handlers {
		writeHandler(&b, h)
	}
	if len(d.Breakers) > 0 {
		b.WriteString("\n## Circuit breakers\n\n| Dependency | State | Open timeout | Half-open probes |\n|---|---|---|---|\n")
		for _, br := range d.Breakers {
			fmt.Fprintf(&b, "| %s | %s | %s | %d |\n", code(br.Dependency), cell(br.State), br.OpenTimeout, br.HalfOpenProbes)
		}
	}
	if len(d.Notes) > 0 {
		b.WriteString("\n## Notes\n\n")
		for _, n := range d.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	return b.String()
}

func writeHandler(b *strings.Builder, h HandlerDescription) {
	p := h.Retry
	fmt.Fprintf(b, "\n## Handler %s\n\n| Setting | Value |\n|---|---|\n", code(h.Name))
	row := func(k, v string) { fmt.Fprintf(b, "| %s | %s |\n", k, v) }
	row("Queue", orUnknown(code(h.Queue)))
	if h.Partitions > 0 {
		row("Partitions", fmt.Sprintf("%d: %s", h.Partitions, codes(h.Consumes)))
	}
	row("Dead-letter queue", orUnknown(code(h.DeadLetterQueue)))
	row("Archive", orUnknown(code(h.Archive)))
	row("Handler timeout", fmt.Sprintf("%s, abandoned %s later (grace); at most %d abandoned still running, then paused", h.HandlerTimeout, h.AbandonGrace, h.MaxAbandoned))
	row("Settle bound", h.SettleText())
	row("Settle bound", h.SettleText())
	row("Maximum attempts", fmt.Sprintf("%d (%d retries)", p.MaxAttempts, p.MaxRetries))
	if nr := p.Native; nr != nil {
		row("Backoff", fmt.Sprintf("held back by the queue (native delayed retry): %s × retry up to %s, no jitter; waits the queue cannot carry use the cascade", nr.Min, nr.Max))
	} else {
		row("Backoff", fmt.Sprintf("%s × %g up to %s, jitter ±%g%%", p.InitialDelay, p.Multiplier, p.MaxDelay, p.Jitter*100))
	}
	row("Maximum total age", p.MaxTotalAge.String())
	row("Maximum RetryAfter / Defer", p.MaxRetryAfter.String())
	if bud := p.Budget; bud != nil {
		v := fmt.Sprintf("%g of first attempts over %s (at least %g/s); when spent: %s", bud.Ratio, bud.Window, bud.MinRetriesPerSecond, bud.WhenSpent)
		if bud.MaxConcurrentRetries > 0 {
			v += fmt.Sprintf("; at most %d concurrent retries (else deferred %s)", bud.MaxConcurrentRetries, bud.ConcurrencyDelay)
		}
		if bud.Adaptive {
			v += "; adaptive policy"
		}
		if bud.Left != nil {
			v += fmt.Sprintf("; %s has %.1f left now", code(bud.Dependency), *bud.Left)
		}
		row("Retry budget", cell(v))
	} else {
		row("Retry budget", "none")
	}
	if br := h.Breaker; br != nil {
		v := "while open: " + br.WhileOpen
		if br.Dependency != "" {
			v = fmt.Sprintf("%s (%s), open %s then %d half-open probes; %s", code(br.Dependency), br.State, br.OpenTimeout, br.HalfOpenProbes, v)
		} else {
			v = "dependency not recorded by the stack; " + v
		}
		row("Circuit breaker", cell(v))
	} else {
		row("Circuit breaker", "none")
	}
	if id := h.Idempotency; id != nil {
		v := fmt.Sprintf("%s; key: %s", code(id.Step), id.Key)
		if id.Journal != "" {
			v += "; journal " + code(id.Journal)
		}
		row("Idempotency", cell(v))
	} else {
		row("Idempotency", "none")
	}
	if l := p.Learned; l != nil {
		text := fmt.Sprintf("stops below %g%% recovered, after %d ended messages; explores %g%%", l.UnlikelyBelow*100, l.MinEvidence, l.Explore*100)
		if l.Shorten {
			text += "; shortens a schedule to the attempt by which 99% of recoveries came"
		}
		row("Learned policy", text)
	} else {
		row("Learned policy", "none")
	}

	b.WriteString("\n| Error class | Action |\n|---|---|\n")
	for _, c := range h.ErrorClasses {
		fmt.Fprintf(b, "| %s | %s |\n", code(c.Class), cell(c.Action))
	}

	b.WriteString("\n| Retry | Attempt | Delay | With jitter | After first failure |\n|---|---|---|---|---|\n")
	for _, r := range p.Schedule {
		fmt.Fprintf(b, "| %d | %d | %s | %s – %s | %s |\n", r.Retry, r.Attempt, r.Delay, r.MinDelay, r.MaxDelay, r.Elapsed)
	}
	if len(p.Schedule) == 0 {
		b.WriteString("| – | – | no retries | – | – |\n")
	}

	if h.Learned != nil {
		b.WriteString("\n| Error type | Learned policy now | Why |\n|---|---|---|\n")
		for _, l := range h.Learned {
			why := l.Reason
			if l.Probe != "" {
				why += "; probe in flight: message " + l.Probe
			}
			fmt.Fprintf(b, "| %s | %s | %s |\n", code(l.ErrorType), l.Verdict.Text(), cell(why))
		}
		if len(h.Learned) == 0 {
			b.WriteString("| – | no failures in the window | – |\n")
		}
	}
}

func code(s string) string {
	if s == "" {
		return ""
	}
	return "`" + strings.ReplaceAll(s, "`", "'") + "`"
}

func codes(ss []string) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = code(s)
	}
	return strings.Join(out, ", ")
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// cell escapes what would end a table cell.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}
