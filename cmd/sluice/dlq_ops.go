package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice/internal/dlqwire"

	"github.com/sluice-go/sluice/dlq"
)

// compensatedFlag confirms replaying (or editing) dead letters whose compensation event
// was published: dlq.Options.Compensated.
const compensatedFlag = "compensated"

const compensatedUsage = "confirm replaying dead letters whose compensation event was published (dlq show names it): the work it undid is redone; recorded in the audit trail"

// compensatedAbout is what replay's and edit's help say of compensated dead letters.
const compensatedAbout = `A handler with a compensation (router.WithCompensation) published an event beside
the dead letter that undid the work the message was part of (an order cancelled
when its payment gave up); 'sluice dlq show' names it. Processing such a message
again redoes that work, so it is refused (exit 2, the message stays in Q.dlq, the
rest of the selection moves) unless --compensated confirms it; the audit trail
records the confirmation. Undo the compensation first, or archive the message.`

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

// maxListedIDs is how many moved ids an operation's summary names.
const maxListedIDs = 20

// opFlags are the flags of replay, archive and purge.
type opFlags struct {
	*dlqFlags
	sel       dlq.Selector
	ids       idList
	dry       *bool
	pace      *time.Duration
	batch     *int
	selectors string // how the usage names them
}

func newOpFlags(e *env, name, verb, synopsis, about string) *opFlags {
	f := &opFlags{dlqFlags: newDLQFlags(e, name, synopsis, about), selectors: "--id, --group, --error-type, --reason, --older-than or --all"}
	f.fs.Var(&f.ids, "id", verb+" the message with this `ID` (repeatable)")
	f.fs.StringVar(&f.sel.Group, "group", "", verb+" the messages of failure group `ID` (see 'sluice dlq groups')")
	f.fs.StringVar(&f.sel.ErrorType, "error-type", "", verb+" the messages of error type `T`")
	f.fs.StringVar(&f.sel.Reason, "reason", "", verb+" the messages dead-lettered for reason `R` (e.g. retry_unlikely)")
	f.fs.DurationVar(&f.sel.OlderThan, "older-than", 0, verb+" the messages that failed at least `D` ago (e.g. 1h)")
	f.fs.BoolVar(&f.sel.All, "all", false, verb+" every message")
	f.dry = f.fs.Bool("dry-run", false, "print what would be done, change nothing")
	// Test hooks, hidden from the usage: --pace waits inside each batch's transaction (so
	// a test can kill the process with a transaction open); --batch sets its size.
	f.pace = f.fs.Duration("pace", 0, "test hook: wait inside each batch's transaction")
	f.batch = f.fs.Int("batch", 0, "test hook: messages per transaction")
	f.hidden["pace"], f.hidden["batch"] = true, true
	return f
}

// selector checks the selector flags once parsed; optional means no selector is allowed.
func (f *opFlags) selector(optional bool) (dlq.Selector, error) {
	f.sel.IDs = f.ids
	if f.sel.All && (len(f.sel.IDs) > 0 || f.sel.Group != "" || f.sel.ErrorType != "" || f.sel.Reason != "" || f.sel.OlderThan != 0) {
		return f.sel, f.usageErrorf("--all cannot be combined with --id, --group, --error-type, --reason or --older-than")
	}
	if f.sel.OlderThan < 0 {
		return f.sel, f.usageErrorf("negative age %s", f.sel.OlderThan)
	}
	if !f.sel.All && f.sel.String() == "" { // no selector flag: what dlq refuses with ErrNoSelector
		if optional {
			return dlq.Selector{All: true}, nil
		}
		return f.sel, f.usageErrorf("one selector is required: %s", f.selectors)
	}
	return f.sel, nil
}

// operate connects and runs op with an Operator that reports progress on a terminal.
func (f *opFlags) operate(e *env, op func(*dlq.Operator) (dlq.Result, error)) (dlq.Result, []string, error) {
	conn, err := connect(e)
	if err != nil {
		return dlq.Result{}, nil, err
	}
	defer conn.Close()
	o := &dlq.Operator{Conn: conn, Now: e.now, Pace: *f.pace, BatchSize: *f.batch}
	var ids []string
	o.OnMoved = func(m dlq.Moved) {
		if len(ids) <= maxListedIDs {
			ids = append(ids, m.ID)
		}
	}
	line := newProgressLine(e)
	o.Progress = line.report
	res, err := op(o)
	line.end()
	return res, ids, err
}

func runDLQReplay(ctx context.Context, e *env, args []string) error {
	f := newOpFlags(e, "replay", "replay",
		"--queue Q (--id ID... | --group ID | --error-type T | --reason R | --older-than D | --all) [--to QUEUE] [--archive] [--compensated] [--dry-run] [--json]",
		`Sends messages of Q.dlq back to their original queue (header x-original-queue
when it names Q or one of Q's partitions, else Q: ignored_origins counts those),
or to --to QUEUE, with their retry state reset: x-retry-count and the
failure-record headers are removed (the first failure time and the history stay,
with the replay added), x-replay-count is incremented;
the message id, payload, AMQP properties and trace context are kept. With
--archive the messages come from Q.dlq.archive instead. Messages move in
batches, each one AMQP transaction, so a replay killed at any point neither
loses nor duplicates a message: run it again to finish. One selector is
required; the filters (--id, --group, --error-type, --reason, --older-than) combine with
AND. A selector that matches nothing exits 3.

`+compensatedAbout)
	to := f.fs.String("to", "", "send the messages to `QUEUE` instead of their original queue (it must exist)")
	archive := f.fs.Bool("archive", false, "replay from Q.dlq.archive instead of Q.dlq")
	compensated := f.fs.Bool(compensatedFlag, false, compensatedUsage)
	if _, err := f.parse(e, args, 0, ""); err != nil {
		return err
	}
	sel, err := f.selector(false)
	if err != nil {
		return err
	}
	opts := dlq.Options{To: *to, DryRun: *f.dry, Compensated: *compensated}
	if *archive {
		opts.From = dlq.FromArchive
	}
	res, ids, err := f.operate(e, func(o *dlq.Operator) (dlq.Result, error) {
		return o.Replay(ctx, f.queue, sel, opts)
	})
	return f.report(e, res, ids, err)
}

func runDLQArchive(ctx context.Context, e *env, args []string) error {
	f := newOpFlags(e, "archive", "archive",
		"--queue Q (--id ID... | --group ID | --error-type T | --reason R | --older-than D | --all) [--retention D] [--dry-run] [--json]",
		`Moves messages of Q.dlq, unchanged, to Q.dlq.archive, where they are kept for
a retention period and can be listed, shown, replayed and purged with --archive.
Archive creates Q.dlq.archive when it does not exist, with x-message-ttl set to
--retention (default 14 days, counted from the archiving); an archive that
exists keeps its settings (a RabbitMQ policy with message-ttl overrides the
argument when lower). Messages move in batches, each one AMQP transaction, as
replay's do. A selector that matches nothing exits 3.`)
	retention := f.fs.Duration("retention", dlqwire.DefaultRetention, "how long the archive keeps a message, when archive creates it")
	qtype := f.fs.String("archive-type", "classic", "queue `TYPE` of the archive when archive creates it: classic or quorum")
	if _, err := f.parse(e, args, 0, ""); err != nil {
		return err
	}
	sel, err := f.selector(false)
	if err != nil {
		return err
	}
	if *retention <= 0 {
		return f.usageErrorf("--retention must be positive, got %s", *retention)
	}
	if *qtype != "classic" && *qtype != "quorum" {
		return f.usageErrorf("--archive-type must be classic or quorum, got %q", *qtype)
	}
	opts := dlq.Options{Retention: *retention, ArchiveType: *qtype, DryRun: *f.dry}
	res, ids, err := f.operate(e, func(o *dlq.Operator) (dlq.Result, error) {
		return o.Archive(ctx, f.queue, sel, opts)
	})
	return f.report(e, res, ids, err)
}

func runDLQPurge(ctx context.Context, e *env, args []string) error {
	f := newOpFlags(e, "purge", "purge",
		"--queue Q [--id ID... | --group ID | --error-type T | --reason R | --older-than D | --all] [--archive] --yes",
		`Deletes messages of Q.dlq (or, with --archive, of Q.dlq.archive): every message
when no selector is given, else the selected ones, in batches, each one AMQP
transaction. This cannot be undone; without --yes nothing happens.`)
	yes := f.fs.Bool("yes", false, "really delete the messages")
	archive := f.fs.Bool("archive", false, "purge Q.dlq.archive instead of Q.dlq")
	if _, err := f.parse(e, args, 0, ""); err != nil {
		return err
	}
	sel, err := f.selector(true)
	if err != nil {
		return err
	}
	opts := dlq.Options{DryRun: *f.dry}
	if *archive {
		opts.From = dlq.FromArchive
	}
	if !*yes && !*f.dry {
		what := "every message"
		if !sel.All {
			what = "the selected messages"
		}
		return f.usageErrorf("refusing to purge %s without --yes: it deletes %s in it", sourceQueue(opts.From, f.queue), what)
	}
	res, ids, err := f.operate(e, func(o *dlq.Operator) (dlq.Result, error) {
		return o.Purge(ctx, f.queue, sel, opts)
	})
	if sel.All && errors.Is(err, dlq.ErrNothingSelected) {
		err = nil // purging an empty queue leaves it empty, as asked
	}
	return f.report(e, res, ids, err)
}

// pastTense names what an operation did to a message.
var pastTense = map[string]string{"replay": "replayed", "archive": "archived", "purge": "purged"}

// report prints the result of an operation and gives its error an exit code.
func (f *opFlags) report(e *env, res dlq.Result, ids []string, err error) error {
	if f.json {
		if jerr := writeJSON(e, newOpJSON(res, ids, err)); jerr != nil && err == nil {
			err = jerr
		}
		return opError(err)
	}
	if res.Source == "" {
		return opError(err)
	}
	w := e.stdout
	done := pastTense[res.Op]
	dest := ""
	if res.Destination != "" {
		dest = " to " + res.Destination
	}
	if res.DryRun {
		fmt.Fprintf(w, "dry run: would %s %d of %d messages in %s%s (nothing changed)", res.Op, res.Moved, res.Scanned, res.Source, dest)
	} else {
		fmt.Fprintf(w, "%s %d of %d messages read from %s%s", done, res.Moved, res.Scanned, res.Source, dest)
	}
	if len(ids) > 0 && len(ids) <= maxListedIDs {
		fmt.Fprintf(w, ": %s", strings.Join(ids, ", "))
	}
	fmt.Fprintf(w, " in %s\n", res.Elapsed.Round(time.Millisecond))
	for _, fl := range res.Failed {
		fmt.Fprintf(w, "not %s, still in %s: %s -> %s: %v\n", done, res.Source, fl.ID, fl.Destination, fl.Err)
	}
	for _, id := range slices.Sorted(maps.Keys(res.MovedByID)) {
		if n := res.MovedByID[id]; n > 1 {
			did := done
			if res.DryRun {
				did = "would " + res.Op
			}
			fmt.Fprintf(w, "id %s: %d messages held it, %s all %d\n", id, n, did, n)
		}
	}
	if len(res.MissingIDs) > 0 {
		fmt.Fprintf(w, "not found in %s: %s\n", res.Source, strings.Join(res.MissingIDs, ", "))
	}
	if res.Compensated > 0 {
		did := done
		if res.DryRun {
			did = "would " + res.Op
		}
		fmt.Fprintf(w, "%s %d message(s) whose compensation event was published (confirmed with --%s): the work it undid is redone\n", did, res.Compensated, compensatedFlag)
	}
	if errors.Is(err, dlq.ErrCompensated) {
		fmt.Fprintf(w, "compensated messages stay in %s: 'sluice dlq show' names their compensation event; --%s replays them once that is what you want\n", res.Source, compensatedFlag)
	}
	if res.IgnoredOrigins > 0 {
		dest := res.Destination
		if dest == "" {
			dest = res.Queue
		}
		fmt.Fprintf(w, "%d messages named another origin than %s or its partitions; they went to %s, not there\n",
			res.IgnoredOrigins, res.Queue, dest)
	}
	return opError(err)
}

// opError gives not-found errors exit code 3: a selector that matched nothing, a missing
// destination queue, a missing DLQ or message.
func opError(err error) error {
	switch {
	case errors.Is(err, dlq.ErrCompensated):
		// Refused, as a purge without --yes is: the flag is what is missing.
		return &codeError{code: exitUsage, err: fmt.Errorf("%w (--%s confirms it)", err, compensatedFlag)}
	case errors.Is(err, dlq.ErrNothingSelected) || errors.Is(err, dlq.ErrDestinationNotFound):
		return notFound(err)
	}
	return dlqError(err)
}

// opJSON is the output of replay, archive and purge with --json.
type opJSON struct {
	dlq.Result
	ElapsedSeconds float64       `json:"elapsed_seconds"`
	IDs            []string      `json:"ids,omitempty"`
	Failed         []failureJSON `json:"failed,omitempty"`
	Error          string        `json:"error,omitempty"`
}

type failureJSON struct {
	ID          string `json:"id"`
	Destination string `json:"destination"`
	Error       string `json:"error"`
}

func newOpJSON(res dlq.Result, ids []string, err error) opJSON {
	out := opJSON{Result: res, ElapsedSeconds: res.Elapsed.Seconds()}
	if len(ids) <= maxListedIDs {
		out.IDs = ids
	}
	for _, f := range res.Failed {
		out.Failed = append(out.Failed, failureJSON{ID: f.ID, Destination: f.Destination, Error: f.Err.Error()})
	}
	if err != nil {
		out.Error = err.Error()
	}
	return out
}
