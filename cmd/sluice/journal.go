package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/sluice-go/sluice/cmd/sluice/internal/retryview"
)

const journalAbout = `Prints the idempotency journal's figures, per service instance: its state
(restoring, failing, ready), keys restored and the restore's duration at start, the
journal's lag (how long a key done elsewhere took to be known here), keys not journaled
yet, records appended, publish failures, corrupt or foreign records skipped and streams
declared again; and the handlers whose journals they cover.

Source: Prometheus when PROMETHEUS_URL is set (the ` + retryview.PromJournalPrefix + `*
series), else the running service's metrics at SLUICE_SERVICE_URL` + retryview.MetricsPath + `
(SLUICE_SERVICE_URL defaults to ` + defaultServiceURL + `: the service's METRICS_ADDR).
The handlers come from the service's ` + policyPath + `. The output says which it read.`

func runJournal(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("sluice journal", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: sluice journal [--json]\n\n%s\n\nFlags:\n", journalAbout)
		printFlags(w, fs, nil)
		fmt.Fprintln(w, "\nExit codes: 0 ok (a service without a journal included), 1 service or Prometheus unreachable or failing, 2 usage error.")
	}
	pos, err := parseInterleaved(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("sluice journal: unexpected arguments %q (see 'sluice journal -h')", pos)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*serviceTimeout)
	defer cancel()
	client := newHTTPClient()
	defer client.CloseIdleConnections()

	out, err := retrySource(e, client).Journal(ctx)
	if err != nil {
		return cliErr(err, e.getenv("PROMETHEUS_URL"), serviceURL(e))
	}
	if *asJSON {
		return writeJSON(e, out)
	}
	return printJournal(e.stdout, out)
}

// printJournal writes j as a table, the console's journal page's.
func printJournal(w io.Writer, j retryview.Journal) error {
	fmt.Fprintf(w, "Idempotency journal from %s.\n", j.Describe())
	if j.HandlersNote != "" {
		fmt.Fprintln(w, j.HandlersNote)
	}
	fmt.Fprintln(w)
	if why := j.NoJournal(); why != "" {
		fmt.Fprintln(w, why)
		return nil
	}
	for _, h := range j.Handlers {
		fmt.Fprintf(w, "Handler %s journals queue %s on %s.\n", h.Name, h.Queue, h.Journal)
	}
	if len(j.Handlers) > 1 {
		fmt.Fprintf(w, "Its %d handlers share one idempotency step: each figure covers their journals together.\n", len(j.Handlers))
	}
	if len(j.Handlers) > 0 {
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tHANDLERS\tSTATE\tRESTORED KEYS\tRESTORE DURATION\tLAG\tUNCONFIRMED\tAPPENDED\tPUBLISH FAILURES\tSKIPPED\tRECREATED")
	for _, f := range j.Instances {
		inst := f.Instance
		if inst == "" {
			inst = "this service"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\n", inst, j.HandlerNames(), f.State, f.RestoredKeys, f.RestoreDuration, f.Lag,
			f.Unconfirmed, f.Appended, f.Failures, f.Skipped, f.Recreated)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nLAG is the age of the last record applied from the journal; SKIPPED are journal messages that were not records (corrupt, foreign); RECREATED are journal streams found deleted and declared again. Counts are since the instance started.")
	return nil
}
