package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/amqpurl"
)

const auditAbout = `Lists the audit trail: every operator action (replay, archive, purge, edit,
replay-unrouted) done from this CLI, the console or the Go API, oldest first,
with who did it, what it selected, how many messages it touched and its result.
The trail is the durable queue sluice.audit, bound to the fanout exchange
sluice.audit; it keeps the last 100,000 records for up to 90 days. Reading it
changes nothing. An action whose process died before recording its end shows
the result "started".`

func runAudit(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("sluice audit", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	queue := fs.String("queue", "", "only the actions on queue `Q`")
	since := fs.Duration("since", 0, "only the actions of the last `D` (e.g. 24h)")
	asJSON := fs.Bool("json", false, "print JSON (for scripts)")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: sluice audit [--queue Q] [--since D] [--json]\n\n%s\n\nFlags:\n", auditAbout)
		printFlags(w, fs, nil)
		fmt.Fprintln(w, "\nRabbitMQ is reached at AMQP_URL (default "+amqpurl.Default+").")
	}
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(e.stdout)
		}
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return &codeError{code: exitUsage, err: err, quiet: true}
	}
	if fs.NArg() > 0 {
		return usageErrorf("sluice audit: unexpected argument %q (see 'sluice audit -h')", fs.Arg(0))
	}
	if *since < 0 {
		return usageErrorf("sluice audit: --since must be positive, got %s", *since)
	}
	q := dlq.AuditQuery{Queue: *queue}
	if *since > 0 {
		q.Since = e.now().Add(-*since)
	}
	conn, err := connect(e)
	if err != nil {
		return err
	}
	defer conn.Close()
	events, err := dlq.ReadAudit(ctx, conn, q)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(e, events)
	}
	if len(events) == 0 {
		fmt.Fprintln(e.stdout, "no action recorded")
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tACTOR\tACTION\tQUEUE\tSELECTOR\tCOUNT\tRESULT\tIDS")
	for _, ev := range events {
		res := ev.Result
		if ev.Error != "" {
			res += ": " + ev.Error
		}
		ids := strings.Join(ev.IDs[:min(len(ev.IDs), 5)], ",")
		if len(ev.IDs) > 5 {
			ids += fmt.Sprintf(",… (%d)", len(ev.IDs))
		}
		sel := ev.Selector
		if ev.ConfirmedCompensated {
			// The confirmation, as the CLI spells it.
			sel += " --" + compensatedFlag
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", ev.At.UTC().Format(time.RFC3339), ev.Actor, ev.Action,
			ev.Source, sel, ev.Count, res, ids)
	}
	return tw.Flush()
}
