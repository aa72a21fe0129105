package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-go/sluice/dlq"
)

// shortErrorBytes is the width of the error column of `dlq list`.
const shortErrorBytes = 60

func runDLQList(ctx context.Context, e *env, args []string) error {
	f := newDLQFlags(e, "list", "--queue Q [--limit N] [--json]",
		"Lists the messages of Q.dlq from the head: id, age (since the failure), error type,\nerror and retries. The DLQ is left exactly as it was.")
	limit := f.fs.Int("limit", 1000, "list at most `N` messages from the head (0: all)")
	if _, err := f.parse(e, args, 0, ""); err != nil {
		return err
	}
	var l dlq.Listing
	err := inspect(e, func(in *dlq.Inspector) (err error) {
		l, err = in.List(ctx, f.queue, *limit)
		return err
	})
	if err != nil {
		return dlqError(err)
	}
	if f.json {
		return writeJSON(e, newListJSON(l))
	}
	if len(l.Records) == 0 {
		fmt.Fprintf(e.stdout, "%s is empty\n", l.DLQ)
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tAGE\tERROR TYPE\tERROR\tRETRIES")
	for _, r := range l.Records {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", r.ID, age(r), orDash(r.ErrorType), orDash(r.ShortError(shortErrorBytes)), r.Retries)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(l.Records) < l.Total {
		fmt.Fprintf(e.stdout, "\n%d of %d messages in %s (--limit 0 lists all)\n", len(l.Records), l.Total, l.DLQ)
	} else {
		fmt.Fprintf(e.stdout, "\n%d messages in %s\n", len(l.Records), l.DLQ)
	}
	return nil
}

// listJSON is the output of `dlq list --json`: the table's fields and a few more, without
// headers and payloads (see `dlq show --json`).
type listJSON struct {
	Queue    string         `json:"queue"`
	DLQ      string         `json:"dlq"`
	Total    int            `json:"total"`
	Messages []listItemJSON `json:"messages"`
}

type listItemJSON struct {
	ID            string     `json:"id"`
	Position      int        `json:"position"`
	AgeSeconds    *float64   `json:"age_seconds"`
	FailedAt      *time.Time `json:"failed_at,omitempty"`
	ErrorType     string     `json:"error_type"`
	ErrorClass    string     `json:"error_class,omitempty"`
	Error         string     `json:"error"`
	Retries       int        `json:"retries"`
	Replays       int        `json:"replays"`
	OriginalQueue string     `json:"original_queue"`
	Handler       string     `json:"handler,omitempty"`
}

func newListJSON(l dlq.Listing) listJSON {
	out := listJSON{Queue: l.Queue, DLQ: l.DLQ, Total: l.Total, Messages: make([]listItemJSON, 0, len(l.Records))}
	for _, r := range l.Records {
		item := listItemJSON{
			ID: r.ID, Position: r.Position, ErrorType: r.ErrorType, ErrorClass: r.ErrorClass,
			Error: r.ErrorMessage, Retries: r.Retries, Replays: r.Replays,
			OriginalQueue: r.OriginalQueue, Handler: r.Handler,
		}
		if r.HasAge {
			s := r.Age.Seconds()
			item.AgeSeconds = &s
		}
		if !r.FailedAt.IsZero() {
			t := r.FailedAt
			item.FailedAt = &t
		}
		out.Messages = append(out.Messages, item)
	}
	return out
}

func runDLQShow(ctx context.Context, e *env, args []string) error {
	f := newDLQFlags(e, "show", "--queue Q [--json] ID",
		"Shows one message of Q.dlq: its failure record, properties, headers and payload.\nThe DLQ is left exactly as it was.")
	pos, err := f.parse(e, args, 1, "message ID")
	if err != nil {
		return err
	}
	var r dlq.Record
	err = inspect(e, func(in *dlq.Inspector) (err error) {
		r, err = in.Show(ctx, f.queue, pos[0])
		return err
	})
	if err != nil {
		return dlqError(err)
	}
	if f.json {
		return writeJSON(e, r)
	}
	printRecord(e.stdout, dlq.DLQName(f.queue), r)
	return nil
}

func printRecord(w io.Writer, dlqName string, r dlq.Record) {
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
	row("error", r.ErrorMessage)
	row("handler", r.Handler)
	row("original queue", r.OriginalQueue)
	if !r.FailedAt.IsZero() {
		row("failed at", fmt.Sprintf("%s (%s ago)", r.FailedAt.UTC().Format(time.RFC3339Nano), age(r)))
	}
	if !r.FirstFailureAt.IsZero() {
		row("first failure", r.FirstFailureAt.UTC().Format(time.RFC3339Nano))
	}
	if r.FailedHost != "" || r.FailedPID != "" {
		row("failed on", fmt.Sprintf("%s (pid %s)", orDash(r.FailedHost), orDash(r.FailedPID)))
	}
	row("retries", fmt.Sprint(r.Retries))
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

	text, enc := dlq.PayloadText(r.Payload)
	fmt.Fprintf(w, "\nPayload (%d bytes, %s):\n%s\n", len(r.Payload), enc, text)
}

func runDLQStats(ctx context.Context, e *env, args []string) error {
	f := newDLQFlags(e, "stats", "--queue Q [--json]",
		"Counts the messages of Q.dlq by error type, with the oldest age of each.\nThe DLQ is left exactly as it was.")
	if _, err := f.parse(e, args, 0, ""); err != nil {
		return err
	}
	var s dlq.Stats
	err := inspect(e, func(in *dlq.Inspector) (err error) {
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
