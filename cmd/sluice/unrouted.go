package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/sluice-go/sluice/internal/topology"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/amqpurl"
)

const unroutedAbout = `Events published to one of sluice's exchanges when no queue was bound for
their routing key are kept in the queue sluice.unrouted (the exchanges' alternate
exchange), with their exchange, routing key, headers and payload. list reads
them without consuming; replay publishes them again to their exchange, for
instance once a subscriber is bound.`

// runUnrouted is `sluice dlq unrouted list|replay`.
func runUnrouted(ctx context.Context, e *env, args []string) error {
	return dispatch(ctx, e, "sluice dlq unrouted", unroutedAbout, []command{
		{name: "list", summary: "list the events no queue was bound for", run: runUnroutedList},
		{name: "replay", summary: "publish them again to their exchange", run: runUnroutedReplay},
	}, args)
}

// unroutedFlags are the flags of both commands.
type unroutedFlags struct {
	fs  *flag.FlagSet
	sel dlq.UnroutedSelector
	ids string
	js  bool
}

func newUnroutedFlags(e *env, name, about string) *unroutedFlags {
	f := &unroutedFlags{fs: flag.NewFlagSet("sluice dlq unrouted "+name, flag.ContinueOnError)}
	f.fs.SetOutput(e.stderr)
	f.fs.StringVar(&f.sel.Exchange, "exchange", "", "only events published to exchange `X`")
	f.fs.StringVar(&f.sel.RoutingKey, "routing-key", "", "only events published with routing key `K`")
	f.fs.StringVar(&f.ids, "id", "", "only the events with these comma-separated `ids`")
	f.fs.BoolVar(&f.js, "json", false, "print JSON (for scripts)")
	f.fs.Usage = func() {
		fmt.Fprintf(f.fs.Output(), "Usage: sluice dlq unrouted %s [flags]\n\n%s\n\nFlags:\n", name, about)
		f.fs.PrintDefaults()
		fmt.Fprintln(f.fs.Output(), "\nRabbitMQ is reached at AMQP_URL (default "+amqpurl.Default+").")
	}
	return f
}

func (f *unroutedFlags) parse(args []string) error {
	if err := f.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &codeError{code: exitUsage, err: err, quiet: true}
	}
	if f.fs.NArg() > 0 {
		return usageErrorf("%s: unexpected argument %q (see '%s -h')", f.fs.Name(), f.fs.Arg(0), f.fs.Name())
	}
	for _, id := range strings.Split(f.ids, ",") {
		if id = strings.TrimSpace(id); id != "" {
			f.sel.IDs = append(f.sel.IDs, id)
		}
	}
	return nil
}

func runUnroutedList(ctx context.Context, e *env, args []string) error {
	f := newUnroutedFlags(e, "list", "Lists the events of sluice.unrouted: id, exchange, routing key, replays, payload.")
	limit := f.fs.Int("limit", 1000, "list at most `N` events (0: all)")
	if err := f.parse(args); err != nil {
		return err
	}
	conn, err := connect(e)
	if err != nil {
		return err
	}
	defer conn.Close()
	l, err := dlq.ListUnrouted(ctx, conn, f.sel, *limit)
	if err != nil {
		return dlqError(err)
	}
	if f.js {
		return writeJSON(e, l)
	}
	if len(l.Events) == 0 {
		fmt.Fprintf(e.stdout, "no selected events in %s (%d in all)\n", topology.UnroutedQueue, l.Total)
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tEXCHANGE\tROUTING KEY\tREPLAYS\tPAYLOAD")
	for _, ev := range l.Events {
		payload := ev.Payload
		if len(payload) > shortErrorBytes {
			payload = payload[:shortErrorBytes] + "…"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", ev.ID, ev.Exchange, orDash(ev.RoutingKey), ev.Replays, payload)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "\n%d selected of %d events in %s\n", len(l.Events), l.Total, topology.UnroutedQueue)
	return nil
}

func runUnroutedReplay(ctx context.Context, e *env, args []string) error {
	f := newUnroutedFlags(e, "replay", "Publishes the selected events again to their exchange with their routing key\n"+
		"(one transaction each with their removal). An event still nobody is bound for\ncomes back to sluice.unrouted.")
	dry := f.fs.Bool("dry-run", false, "print what would be replayed, change nothing")
	if err := f.parse(args); err != nil {
		return err
	}
	if f.sel.Exchange == "" && len(f.sel.IDs) == 0 {
		return usageErrorf("%s: give --exchange or --id (the queue is shared by every service)", f.fs.Name())
	}
	conn, err := connect(e)
	if err != nil {
		return err
	}
	defer conn.Close()
	res, err := dlq.Operator{Conn: conn}.ReplayUnrouted(ctx, f.sel, *dry)
	if f.js {
		if jerr := writeJSON(e, res); jerr != nil {
			return jerr
		}
		return dlqError(err)
	}
	verb := "replayed"
	if *dry {
		verb = "would replay"
	}
	for _, ev := range res.Replayed {
		fmt.Fprintf(e.stdout, "%s %s to exchange %s with key %q\n", verb, ev.ID, ev.Exchange, ev.RoutingKey)
	}
	fmt.Fprintf(e.stdout, "%s %d of %d events read\n", verb, len(res.Replayed), res.Scanned)
	return dlqError(err)
}
