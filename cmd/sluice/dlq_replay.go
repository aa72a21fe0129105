package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/sluice-go/sluice/dlq"
)

// idList is a repeatable --id flag.
type idList []string

func (l *idList) String() string { return strings.Join(*l, ",") }

func (l *idList) Set(v string) error {
	if v == "" {
		return errors.New("empty id")
	}
	*l = append(*l, v)
	return nil
}

func runDLQReplay(ctx context.Context, e *env, args []string) error {
	f := newDLQFlags(e, "replay", "--queue Q (--id ID... | --error-type T | --older-than D | --all) [--dry-run] [--json]",
		`Sends messages of Q.dlq back to their original queue (header x-original-queue,
else Q) with their retry state reset: x-retry-count and the failure-record and
retry headers are removed, x-replay-count is incremented; the message id,
payload, AMQP properties and trace context are kept. Each message moves in its
own AMQP transaction, so a replay killed at any point neither loses nor
duplicates a message: run it again to finish. One selector is required; the
filters (--id, --error-type, --older-than) combine with AND.`)
	var sel dlq.Selector
	var ids idList
	f.fs.Var(&ids, "id", "replay the message with this `ID` (repeatable)")
	f.fs.StringVar(&sel.ErrorType, "error-type", "", "replay the messages of error type `T`")
	f.fs.DurationVar(&sel.OlderThan, "older-than", 0, "replay the messages that failed at least `D` ago (e.g. 1h)")
	f.fs.BoolVar(&sel.All, "all", false, "replay every message")
	dry := f.fs.Bool("dry-run", false, "print what would be replayed, change nothing")
	// --pace is a test hook (hidden from the usage): each message's transaction waits this
	// long between its publish and its acknowledgement, so a test can kill the process
	// with a transaction open.
	pace := f.fs.Duration("pace", 0, "test hook: wait inside each message's transaction")
	f.hidden["pace"] = true
	if _, err := f.parse(e, args, 0, ""); err != nil {
		return err
	}
	sel.IDs = ids
	if sel.All && (len(sel.IDs) > 0 || sel.ErrorType != "" || sel.OlderThan != 0) {
		return f.usageErrorf("--all cannot be combined with --id, --error-type or --older-than")
	}
	if err := sel.Validate(); err != nil {
		if errors.Is(err, dlq.ErrNoSelector) {
			return f.usageErrorf("one selector is required: --id, --error-type, --older-than or --all")
		}
		return f.usageErrorf("%s", strings.TrimPrefix(err.Error(), "dlq: "))
	}
	conn, err := connect(e)
	if err != nil {
		return err
	}
	defer conn.Close()
	r := dlq.NewReplayer(conn)
	r.Now = e.now
	r.Pace = *pace
	var res dlq.ReplayResult
	if *dry {
		res, err = r.DryRun(ctx, f.queue, sel)
	} else {
		if !f.json {
			// Printed as each commit lands, so a run that is interrupted says what it did.
			r.OnReplay = func(m dlq.Replayed) {
				fmt.Fprintf(e.stdout, "replayed %s -> %s\n", m.ID, m.Destination)
			}
		}
		res, err = r.Replay(ctx, f.queue, sel)
	}
	if f.json {
		if jerr := writeJSON(e, newReplayJSON(res)); jerr != nil && err == nil {
			err = jerr
		}
		return dlqError(err)
	}
	printReplay(e, res)
	return dlqError(err)
}

func printReplay(e *env, res dlq.ReplayResult) {
	w := e.stdout
	if res.DryRun {
		fmt.Fprintf(w, "dry run: would replay %d of %d messages in %s (nothing changed)\n", len(res.Replayed), res.Scanned, res.DLQ)
		for _, m := range res.Replayed {
			fmt.Fprintf(w, "  %s -> %s (%s)\n", m.ID, m.Destination, orDash(m.ErrorType))
		}
	} else {
		ids := make([]string, len(res.Replayed))
		for i, m := range res.Replayed {
			ids[i] = m.ID
		}
		fmt.Fprintf(w, "replayed %d of %d messages read from %s", len(res.Replayed), res.Scanned, res.DLQ)
		if len(ids) > 0 {
			fmt.Fprintf(w, ": %s", strings.Join(ids, ", "))
		}
		fmt.Fprintln(w)
	}
	for _, f := range res.Failed {
		fmt.Fprintf(w, "not replayed, still in %s: %s -> %s: %v\n", res.DLQ, f.ID, f.Destination, f.Err)
	}
	if len(res.MissingIDs) > 0 {
		fmt.Fprintf(w, "not found in %s: %s\n", res.DLQ, strings.Join(res.MissingIDs, ", "))
	}
}

// replayJSON is the output of `dlq replay --json`.
type replayJSON struct {
	dlq.ReplayResult
	Count  int           `json:"count"`
	Failed []failureJSON `json:"failed,omitempty"`
}

type failureJSON struct {
	ID          string `json:"id"`
	Destination string `json:"destination"`
	Error       string `json:"error"`
}

func newReplayJSON(res dlq.ReplayResult) replayJSON {
	out := replayJSON{ReplayResult: res, Count: len(res.Replayed)}
	for _, f := range res.Failed {
		out.Failed = append(out.Failed, failureJSON{ID: f.ID, Destination: f.Destination, Error: f.Err.Error()})
	}
	return out
}

func runDLQPurge(ctx context.Context, e *env, args []string) error {
	f := newDLQFlags(e, "purge", "--queue Q --yes",
		"Deletes every message of Q.dlq. This cannot be undone; without --yes nothing happens.")
	yes := f.fs.Bool("yes", false, "really delete every message")
	if _, err := f.parse(e, args, 0, ""); err != nil {
		return err
	}
	if !*yes {
		return f.usageErrorf("refusing to purge %s without --yes: it deletes every message in it", dlq.DLQName(f.queue))
	}
	conn, err := connect(e)
	if err != nil {
		return err
	}
	defer conn.Close()
	n, err := dlq.Purge(ctx, conn, f.queue)
	if err != nil {
		return dlqError(err)
	}
	if f.json {
		return writeJSON(e, map[string]any{"queue": f.queue, "dlq": dlq.DLQName(f.queue), "purged": n})
	}
	fmt.Fprintf(e.stdout, "purged %d messages from %s\n", n, dlq.DLQName(f.queue))
	return nil
}
