// Command sluice is the operator CLI of the sluice framework.
//
//	sluice dlq list|show|stats|groups|replay|archive|purge|edit --queue Q ...
//	sluice audit [--queue Q] [--since D]
//	sluice trace <message-id | trace-id>
//	sluice console [--addr 127.0.0.1:8090] [--queue Q]...
//
// It connects to RabbitMQ at AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/; a
// comma-separated list is tried in order). The URL is read from the environment only, never
// from a flag, so the password does not show in process listings; every URL the CLI prints
// has its password masked.
//
// Exit codes: 0 ok, 1 the operation failed (broker unreachable, replay failed), 2 usage
// error (bad flags, missing --queue, purge without --yes), 3 not found (queue, message,
// destination queue, or a selector that matches no message).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-go/sluice/internal/amqpurl"
	"github.com/sluice-go/sluice/internal/mask"
)

// commands are sluice's subcommands. Adding one is one line here and a file beside.
var commands = []command{
	{name: "dlq", summary: "inspect, replay and purge dead-letter queues", run: runDLQ},
	{name: "trace", summary: "draw a message's life (attempts, delays, outcome) from Jaeger", run: runTrace},
	{name: "audit", summary: "list the audit trail of operator actions (who replayed, archived, purged or edited what)", run: runAudit},
	{name: "console", summary: "serve the operator console (web pages and a JSON API) on 127.0.0.1:8090", run: runConsole},
	{name: "retries", summary: "show retry statistics per handler and error type (service endpoint or Prometheus)", run: runRetries},
	{name: "policy", summary: "show the running service's retry decision matrix (--markdown for a runbook)", run: runPolicy},
	{name: "journal", summary: "show the idempotency journal's state, restore, lag and failures (service endpoint or Prometheus)", run: runJournal},
}

// Exit codes.
const (
	exitOK       = 0
	exitFailed   = 1
	exitUsage    = 2
	exitNotFound = 3
)

// command is a subcommand: run gets the arguments after its name.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, e *env, args []string) error
}

// env is what a command may touch, so tests can run it in-process.
type env struct {
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
	now    func() time.Time
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, &env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, now: time.Now}, os.Args[1:])
	stop()
	os.Exit(code)
}

// run executes the command line args and returns the exit code.
func run(ctx context.Context, e *env, args []string) int {
	err := dispatch(ctx, e, "sluice", "", commands, args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	code := exitFailed
	var ce *codeError
	if errors.As(err, &ce) {
		code = ce.code
		if ce.quiet {
			return code
		}
	}
	msg := redact(err.Error(), e.getenv("AMQP_URL"))
	if !strings.HasPrefix(msg, "sluice") {
		msg = "sluice: " + msg
	}
	fmt.Fprintln(e.stderr, msg)
	return code
}

// dispatch runs the command of cmds named by args[0]; prog is the command path so far and
// about is printed above the list of commands.
func dispatch(ctx context.Context, e *env, prog, about string, cmds []command, args []string) error {
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "Usage: %s <command> [arguments]\n\n", prog)
		if about != "" {
			fmt.Fprintln(w, about)
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, "Commands:")
		for _, c := range cmds {
			fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
		}
		fmt.Fprintf(w, "\nRun '%s <command> -h' for a command's flags.\n", prog)
		fmt.Fprintln(w, "RabbitMQ is reached at AMQP_URL (default "+amqpurl.Default+").")
		fmt.Fprintln(w, "Jaeger's query API is reached at JAEGER_QUERY_URL (default http://127.0.0.1:16686).")
		fmt.Fprintln(w, "Exit codes: 0 ok, 1 operation failed, 2 usage error, 3 not found (or nothing selected).")
	}
	if len(args) == 0 {
		usage(e.stderr)
		return usageErrorf("%s: no command given", prog)
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		usage(e.stdout)
		return nil
	}
	for _, c := range cmds {
		if c.name == args[0] {
			return c.run(ctx, e, args[1:])
		}
	}
	usage(e.stderr)
	return usageErrorf("%s: unknown command %q", prog, args[0])
}

// codeError is an error with the exit code it ends the process with; a quiet one was
// already reported (the flag package prints its own errors).
type codeError struct {
	code  int
	err   error
	quiet bool
}

func (e *codeError) Error() string { return e.err.Error() }
func (e *codeError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &codeError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

func notFound(err error) error { return &codeError{code: exitNotFound, err: err} }

// redact masks the URLs of AMQP_URL and their passwords in text (internal/mask.Text), the
// last guard before anything reaches the terminal.
func redact(text, amqpURL string) string {
	for _, u := range strings.Split(amqpURL, ",") {
		text = mask.Text(text, strings.TrimSpace(u))
	}
	return text
}
