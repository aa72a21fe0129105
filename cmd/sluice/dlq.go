package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/dlqwire"
	"github.com/sluice-go/sluice/internal/topology"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/amqpurl"
)

// dlqCommands are the subcommands of `sluice dlq`.
var dlqCommands = []command{
	{name: "list", summary: "list the DLQ's messages: id, age, error type, error, retries", run: runDLQList},
	{name: "show", summary: "show one message: failure record, headers, payload", run: runDLQShow},
	{name: "stats", summary: "count the DLQ's messages by error type, with the oldest age", run: runDLQStats},
	{name: "groups", summary: "failure groups: messages that failed the same way, largest first", run: runDLQGroups},
	{name: "replay", summary: "send messages back to their original queue, retries reset", run: runDLQReplay},
	{name: "archive", summary: "move messages to Q.dlq.archive, kept for a retention period", run: runDLQArchive},
	{name: "edit", summary: "correct one message's payload or headers and replay it; the original is archived", run: runDLQEdit},
	{name: "purge", summary: "delete messages of the DLQ (needs --yes)", run: runDLQPurge},
	{name: "unrouted", summary: "list and replay events no queue was bound for (sluice.unrouted)", run: runUnrouted},
}

const dlqAbout = `Each command works on the dead-letter queue Q.dlq of a queue Q that uses
sluice's topology, named with --queue Q (with --archive: on Q.dlq.archive).
list, show, stats and groups never consume or reorder the DLQ: they read
without acknowledging, and RabbitMQ puts every message back in its place.
replay, archive and purge select messages with --id, --group, --error-type,
--reason, --older-than or --all, and move them in batches, each one AMQP transaction.`

func runDLQ(ctx context.Context, e *env, args []string) error {
	return dispatch(ctx, e, "sluice dlq", dlqAbout, dlqCommands, args)
}

// dlqFlags are the flags every dlq command has.
type dlqFlags struct {
	fs     *flag.FlagSet
	queue  string
	json   bool
	hidden map[string]bool
}

// newDLQFlags returns the flag set of `sluice dlq name`; synopsis follows the command in
// the usage line and about explains it.
func newDLQFlags(e *env, name, synopsis, about string) *dlqFlags {
	f := &dlqFlags{fs: flag.NewFlagSet("sluice dlq "+name, flag.ContinueOnError), hidden: map[string]bool{}}
	f.fs.SetOutput(e.stderr)
	f.fs.StringVar(&f.queue, "queue", "", "the consumed queue `Q`; the command works on Q.dlq (required)")
	f.fs.BoolVar(&f.json, "json", false, "print JSON (for scripts)")
	f.fs.Usage = func() {
		w := f.fs.Output()
		fmt.Fprintf(w, "Usage: sluice dlq %s %s\n\n%s\n\nFlags:\n", name, synopsis, about)
		printFlags(w, f.fs, f.hidden)
		fmt.Fprintln(w, "\nRabbitMQ is reached at AMQP_URL (default "+amqpurl.Default+").")
		fmt.Fprintln(w, "Exit codes: 0 ok, 1 operation failed, 2 usage error, 3 not found (or nothing selected).")
	}
	return f
}

// parse parses args, flags and positional arguments in any order, checks --queue and that
// there are exactly nargs positional arguments, and returns them.
func (f *dlqFlags) parse(e *env, args []string, nargs int, argName string) ([]string, error) {
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			f.fs.SetOutput(e.stdout) // asked for: not an error
		}
		if a == "--" {
			break
		}
	}
	var pos []string
	for {
		if err := f.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &codeError{code: exitUsage, err: err, quiet: true}
		}
		rest := f.fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			pos = append(pos, rest...) // after "--" everything is positional
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if f.queue == "" {
		return nil, f.usageErrorf("--queue is required")
	}
	if len(pos) != nargs {
		if nargs == 0 {
			return nil, f.usageErrorf("unexpected argument %q", pos[0])
		}
		return nil, f.usageErrorf("want exactly one %s, got %d arguments", argName, len(pos))
	}
	return pos, nil
}

// usageErrorf returns a usage error that names the command and where its usage is.
func (f *dlqFlags) usageErrorf(format string, args ...any) error {
	return usageErrorf("%s: %s (see '%s -h')", f.fs.Name(), fmt.Sprintf(format, args...), f.fs.Name())
}

// printFlags lists fs's flags with two dashes, but those hidden names.
func printFlags(w io.Writer, fs *flag.FlagSet, hidden map[string]bool) {
	fs.VisitAll(func(fl *flag.Flag) {
		if hidden[fl.Name] {
			return
		}
		typ, usage := flag.UnquoteUsage(fl)
		if typ != "" {
			typ = " " + typ
		}
		fmt.Fprintf(w, "  --%s%s\n    \t%s\n", fl.Name, typ, usage)
	})
}

// connect dials AMQP_URL (a comma-separated list is tried in order).
func connect(e *env) (*amqp091.Connection, error) {
	return dlqwire.Dial(amqpurl.Split(e.getenv("AMQP_URL"))...)
}

// inspect connects and runs read with an inspector on the environment's clock, reading
// the archive when archive is set, with a progress line on a terminal.
func inspect(e *env, archive bool, read func(*dlq.Inspector) error) error {
	conn, err := connect(e)
	if err != nil {
		return err
	}
	defer conn.Close()
	line := newProgressLine(e)
	defer line.end()
	return read(&dlq.Inspector{Conn: conn, Now: e.now, From: sourceOf(archive), Progress: line.report})
}

// sourceQueue is the queue src names for queue: Q.dlq or Q.dlq.archive.
func sourceQueue(src dlq.Source, queue string) string {
	if src == dlq.FromArchive {
		return topology.Archive(queue)
	}
	return topology.DLQ(queue)
}

// dlqError gives not-found errors their exit code.
func dlqError(err error) error {
	if errors.Is(err, sluice.ErrQueueNotFound) || errors.Is(err, dlq.ErrMessageNotFound) {
		return notFound(err)
	}
	return err
}

func writeJSON(e *env, v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
