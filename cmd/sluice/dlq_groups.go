package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/failure"
)

// groupSampleBytes is the width of the sample column of `dlq groups`.
const groupSampleBytes = 60

func runDLQGroups(ctx context.Context, e *env, args []string) error {
	f := newDLQFlags(e, "groups", "--queue Q [--archive] [--json]",
		`Lists the failure groups of Q.dlq, largest first: messages of one handler that
failed with the same error type at the same place (a panic's top stack frames,
else the error message with numbers, ids and UUIDs stripped). Give a group's ID
to replay, archive or purge with --group. The DLQ is left exactly as it was.
--json prints an array of objects with id, handler, error_type, fingerprint,
sample, sample_id, count, first_failed_at and last_failed_at.`)
	archive := f.fs.Bool("archive", false, "group Q.dlq.archive instead of Q.dlq")
	if _, err := f.parse(e, args, 0, ""); err != nil {
		return err
	}
	var groups []dlq.Group
	err := inspect(e, *archive, func(in *dlq.Inspector) (err error) {
		groups, err = in.Groups(ctx, f.queue)
		return err
	})
	if err != nil {
		return dlqError(err)
	}
	if f.json {
		return writeJSON(e, groups)
	}
	name := sourceQueue(sourceOf(*archive), f.queue)
	if len(groups) == 0 {
		fmt.Fprintf(e.stdout, "%s is empty\n", name)
		return nil
	}
	total := 0
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tCOUNT\tHANDLER\tERROR TYPE\tFIRST FAILED\tLAST FAILED\tSAMPLE")
	for _, g := range groups {
		total += g.Count
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", g.ID, g.Count, orDash(g.Handler), orDash(g.ErrorType),
			fmtTime(g.FirstFailedAt), fmtTime(g.LastFailedAt), orDash(failure.Truncate(g.Sample, groupSampleBytes)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "\n%d groups, %d messages in %s\n", len(groups), total, name)
	return nil
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
