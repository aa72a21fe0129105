package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-go/sluice/internal/dlqview"
	"github.com/sluice-go/sluice/internal/dlqwire"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/mask"

	"github.com/sluice-go/sluice/dlq"
)

// shortErrorBytes is the width of the error column of `dlq list`.
const shortErrorBytes = 60

func runDLQList(ctx context.Context, e *env, args []string) error {
	f := newDLQFlags(e, "list", "--queue Q [--limit N] [--group ID] [--error-type T] [--archive] [--json]",
		"Lists the messages of Q.dlq from the head: id, age (since the failure), error type,\nerror and retries. The DLQ is left exactly as it was. Rows are printed as they\nare read, so a DLQ of any length lists in constant memory.")
	limit := f.fs.Int("limit", 1000, "list at most `N` messages from the head (0: all)")
	var sel dlq.Selector
	f.fs.StringVar(&sel.Group, "group", "", "list only the messages of failure group `ID`")
	f.fs.StringVar(&sel.ErrorType, "error-type", "", "list only the messages of error type `T`")
	archive := f.fs.Bool("archive", false, "list Q.dlq.archive instead of Q.dlq")
	if _, err := f.parse(e, args, 0, ""); err != nil {
		return err
	}
	out := newListWriter(e, f.json, f.queue, sourceQueue(sourceOf(*archive), f.queue))
	var total int
	err := inspect(e, *archive, func(in *dlq.Inspector) (err error) {
		total, err = in.Messages(ctx, f.queue, sel, func(r dlq.Record) bool {
			out.add(r)
			return *limit <= 0 || out.n < *limit
		})
		return err
	})
	if err != nil {
		return dlqError(err)
	}
	return out.finish(total, sel.Group != "" || sel.ErrorType != "")
}

func sourceOf(archive bool) dlq.Source {
	if archive {
		return dlq.FromArchive
	}
	return dlq.FromDLQ
}

// listWriter prints list's rows as they come: a table flushed every listFlushRows rows,
// or a JSON object whose messages array is written item by item.
type listWriter struct {
	e         *env
	json      bool
	queue     string
	dlq       string
	n         int
	tw        *tabwriter.Writer
	jsonStart bool
}

// listFlushRows is how many table rows share their column widths.
const listFlushRows = 1000

func newListWriter(e *env, asJSON bool, queue, dlqName string) *listWriter {
	return &listWriter{e: e, json: asJSON, queue: queue, dlq: dlqName}
}

func (w *listWriter) add(r dlq.Record) {
	w.n++
	if w.json {
		if !w.jsonStart {
			fmt.Fprintf(w.e.stdout, "{\n  \"queue\": %s,\n  \"dlq\": %s,\n  \"messages\": [\n", jsonString(w.queue), jsonString(w.dlq))
			w.jsonStart = true
		} else {
			fmt.Fprint(w.e.stdout, ",\n")
		}
		b, _ := json.Marshal(dlqview.SummaryOf(dlqview.Record(r))) // no headers, no payload: see `dlq show --json`
		fmt.Fprintf(w.e.stdout, "    %s", b)
		return
	}
	if w.tw == nil {
		w.tw = tabwriter.NewWriter(w.e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w.tw, "ID\tAGE\tERROR TYPE\tERROR\tRETRIES")
	}
	sum := dlqview.SummaryOf(dlqview.Record(r)) // masked
	fmt.Fprintf(w.tw, "%s\t%s\t%s\t%s\t%d\n", r.ID, age(r), orDash(failure.Truncate(sum.ErrorType, shortErrorBytes)), orDash(failure.Truncate(sum.Error, shortErrorBytes)), r.Retries)
	if w.n%listFlushRows == 0 {
		_ = w.tw.Flush()
	}
}

func (w *listWriter) finish(total int, filtered bool) error {
	if w.json {
		if !w.jsonStart {
			fmt.Fprintf(w.e.stdout, "{\n  \"queue\": %s,\n  \"dlq\": %s,\n  \"messages\": [", jsonString(w.queue), jsonString(w.dlq))
		}
		_, err := fmt.Fprintf(w.e.stdout, "\n  ],\n  \"total\": %d\n}\n", total)
		return err
	}
	if w.tw == nil {
		if filtered {
			fmt.Fprintf(w.e.stdout, "no message of the %d in %s matches\n", total, w.dlq)
		} else {
			fmt.Fprintf(w.e.stdout, "%s is empty\n", w.dlq)
		}
		return nil
	}
	if err := w.tw.Flush(); err != nil {
		return err
	}
	switch {
	case filtered:
		fmt.Fprintf(w.e.stdout, "\n%d matching of %d messages in %s\n", w.n, total, w.dlq)
	case w.n < total:
		fmt.Fprintf(w.e.stdout, "\n%d of %d messages in %s (--limit 0 lists all)\n", w.n, total, w.dlq)
	default:
		fmt.Fprintf(w.e.stdout, "\n%d messages in %s\n", w.n, w.dlq)
	}
	return nil
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func runDLQShow(ctx context.Context, e *env, args []string) error {
	f := newDLQFlags(e, "show", "--queue Q [--archive] [--json] [--position N] [--full | --payload-file F] ID",
		fmt.Sprintf("Shows one message of Q.dlq: its failure record, properties, headers and the first\n"+
			"%d bytes of its payload, with passwords in URLs and Authorization-like header\n"+
			"values masked (display only). When several messages hold the id, all are shown,\n"+
			"by position. The DLQ is left exactly as it was.", dlqview.PreviewBytes))
	archive := f.fs.Bool("archive", false, "show a message of Q.dlq.archive instead of Q.dlq")
	position := f.fs.Int("position", 0, "of several messages with the id, show the one at position `N` in the DLQ")
	full := f.fs.Bool("full", false, "print the whole payload (credentials still masked)")
	payloadFile := f.fs.String("payload-file", "", "write the payload, byte for byte and unmasked, to file `F`")
	pos, err := f.parse(e, args, 1, "message ID")
	if err != nil {
		return err
	}
	if *full && *payloadFile != "" {
		return f.usageErrorf("--full and --payload-file exclude each other")
	}
	var recs []dlq.Record
	err = inspect(e, *archive, func(in *dlq.Inspector) (err error) {
		recs, err = in.Show(ctx, f.queue, pos[0])
		return err
	})
	if err != nil {
		return dlqError(err)
	}
	dlqName := sourceQueue(sourceOf(*archive), f.queue)
	if *position > 0 {
		i := slices.IndexFunc(recs, func(r dlq.Record) bool { return r.Position == *position })
		if i < 0 {
			return notFound(fmt.Errorf("message %q is not at position %d in %s (positions: %s): %w",
				pos[0], *position, dlqName, positions(recs), dlq.ErrMessageNotFound))
		}
		recs = recs[i : i+1]
	}
	if *payloadFile != "" {
		if len(recs) > 1 {
			return f.usageErrorf("%d messages hold id %q (positions %s): name one with --position", len(recs), pos[0], positions(recs))
		}
		if err := os.WriteFile(*payloadFile, recs[0].Payload, 0o600); err != nil {
			return fmt.Errorf("write payload of %q: %w", pos[0], err)
		}
		fmt.Fprintf(e.stdout, "wrote the payload of %s (position %d in %s, %d bytes) to %s\n",
			recs[0].ID, recs[0].Position, dlqName, len(recs[0].Payload), *payloadFile)
		return nil
	}
	if f.json {
		return writeJSON(e, recs[0])
	}
	if len(recs) > 1 {
		fmt.Fprintf(e.stdout, "%d messages in %s hold id %s, at positions %s (--position N shows one):\n\n",
			len(recs), dlqName, pos[0], positions(recs))
	}
	for i, r := range recs {
		if i > 0 {
			fmt.Fprintln(e.stdout, "\n----")
		}
		printRecord(e.stdout, dlqName, r, *full)
	}
	return nil
}

// positions lists the records' positions: "3, 7".
func positions(recs []dlq.Record) string {
	ps := make([]string, len(recs))
	for i, r := range recs {
		ps[i] = strconv.Itoa(r.Position)
	}
	return strings.Join(ps, ", ")
}

// printRecord prints the display form of r (see dlqview.Display): masked and bounded, the
// payload cut to dlqview.PreviewBytes unless full.
func printRecord(w io.Writer, dlqName string, rec dlq.Record, full bool) {
	d := dlqview.Of(dlqview.Record(rec))
	r := dlq.Record(d.Record)
	fmt.Fprintf(w, "Message %s (position %d in %s)\n\nRecord:\n", r.ID, r.Position, dlqName)
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "  %s:\t%s\n", k, v)
		}
	}
	typ := orDash(r.ErrorType)
	if r.ErrorClass != "" {
		typ += " (" + r.ErrorClass + ")"
	}
	row("error type", typ)
	row("reason", r.Reason)
	row("error", r.ErrorMessage)
	if c := dlqview.Compensation(dlqview.Record(r)); c != "" {
		if r.CompensationID != "" {
			c += " (replay and edit need --" + compensatedFlag + ": the work it undid would be redone)"
		}
		row("compensation", c)
	}
	if r.FailedStage != "" {
		row("failed in", r.FailedStage+" (no handler ran)")
	} else {
		row("handler", r.Handler)
	}
	row("group", r.GroupID+" ("+r.Fingerprint+")")
	row("original queue", r.OriginalQueue)
	if r.IgnoredOrigin != "" {
		row("recorded origin", r.IgnoredOrigin+" (not followed: neither the queue nor one of its partitions)")
	}
	if r.ProducerOriginalQueue != "" {
		row("producer said", "x-original-queue "+r.ProducerOriginalQueue+" (display only)")
	}
	if !r.FailedAt.IsZero() {
		row("failed at", fmt.Sprintf("%s (%s ago)", r.FailedAt.UTC().Format(time.RFC3339Nano), age(r)))
	}
	if !r.FirstFailureAt.IsZero() {
		row("first failure", r.FirstFailureAt.UTC().Format(time.RFC3339Nano))
	}
	if r.FailedHost != "" || r.FailedPID != "" {
		row("failed on", fmt.Sprintf("%s (pid %s)", orDash(r.FailedHost), orDash(r.FailedPID)))
	}
	retries := fmt.Sprint(r.Retries)
	if r.RetryNote != "" {
		retries += " (" + r.RetryNote + ")"
	}
	row("retries", retries)
	row("replays", fmt.Sprint(r.Replays))
	_ = tw.Flush()
	if len(r.History) > 0 {
		fmt.Fprintln(w, "  history:")
		for _, h := range r.History {
			fmt.Fprintf(w, "    attempt %d at %s: %s: %s\n", h.Attempt, h.At.UTC().Format(time.RFC3339Nano), h.Type, h.Message)
		}
	}
	if r.ErrorStack != "" {
		fmt.Fprintln(w, "  stack:")
		for _, line := range strings.Split(strings.TrimRight(r.ErrorStack, "\n"), "\n") {
			fmt.Fprintln(w, "    "+line)
		}
	}

	fmt.Fprintln(w, "\nProperties:")
	p := r.Properties
	tw = tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	row("content-type", p.ContentType)
	row("content-encoding", p.ContentEncoding)
	if p.DeliveryMode != 0 {
		row("delivery-mode", fmt.Sprint(p.DeliveryMode))
	}
	if p.Priority != 0 {
		row("priority", fmt.Sprint(p.Priority))
	}
	row("correlation-id", p.CorrelationID)
	row("reply-to", p.ReplyTo)
	row("expiration", p.Expiration)
	row("message-id", p.MessageID)
	if !p.Timestamp.IsZero() {
		row("timestamp", p.Timestamp.UTC().Format(time.RFC3339))
	}
	row("type", p.Type)
	row("user-id", p.UserID)
	row("app-id", p.AppID)
	_ = tw.Flush()

	fmt.Fprintln(w, "\nHeaders:")
	tw = tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	for _, k := range slices.Sorted(maps.Keys(r.Headers)) {
		fmt.Fprintf(tw, "  %s:\t%s\n", k, r.Headers[k])
	}
	_ = tw.Flush()
	if d.HeadersOmitted > 0 {
		fmt.Fprintf(w, "  ... and %d more headers (--json shows the same %d)\n", d.HeadersOmitted, dlqview.MaxHeadersShown)
	}
	if len(d.SameID) > 0 {
		fmt.Fprintf(w, "\nSame id also at positions: %s\n", joinInts(d.SameID))
	}

	text, enc, truncated := d.Preview, d.PreviewEncoding, d.PayloadTruncated
	if full {
		text, enc = dlqwire.PayloadText(rec.Payload)
		text, truncated = mask.Credentials(text), false
	}
	fmt.Fprintf(w, "\nPayload (%d bytes, %s", len(rec.Payload), enc)
	if truncated {
		fmt.Fprintf(w, ", first %d shown", len(text))
	}
	fmt.Fprintf(w, "; masking is display-only):\n%s\n", text)
	if truncated {
		fmt.Fprintf(w, "... the rest of the %d bytes is not shown: --full prints all of it, --payload-file F writes it byte for byte\n", len(rec.Payload))
	}
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

func runDLQStats(ctx context.Context, e *env, args []string) error {
	f := newDLQFlags(e, "stats", "--queue Q [--archive] [--json]",
		"Counts the messages of Q.dlq by error type, with the oldest age of each.\nThe DLQ is left exactly as it was.")
	archive := f.fs.Bool("archive", false, "count Q.dlq.archive instead of Q.dlq")
	if _, err := f.parse(e, args, 0, ""); err != nil {
		return err
	}
	var s dlq.Stats
	err := inspect(e, *archive, func(in *dlq.Inspector) (err error) {
		s, err = in.Stats(ctx, f.queue)
		return err
	})
	if err != nil {
		return dlqError(err)
	}
	if f.json {
		return writeJSON(e, s)
	}
	if s.Total == 0 {
		fmt.Fprintf(e.stdout, "%s is empty\n", s.DLQ)
		return nil
	}
	fmt.Fprintf(e.stdout, "%s: %d messages, oldest %s\n\n", s.DLQ, s.Total, fmtAge(s.Oldest))
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ERROR TYPE\tCOUNT\tOLDEST")
	for _, t := range s.ByErrorType {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", orDash(t.ErrorType), t.Count, fmtAge(t.Oldest))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func age(r dlq.Record) string {
	if !r.HasAge {
		return "-"
	}
	return fmtAge(r.Age)
}

// fmtAge writes a duration the way an operator reads an age: 42s, 3m12s, 2h05m, 3d04h.
func fmtAge(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}
