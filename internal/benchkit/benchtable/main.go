// Command benchtable runs a `go test -bench` command, streams its output, and then prints
// one table in which each sluice figure stands beside its references and the ratio.
//
//	go run ./internal/benchkit/benchtable [-rounds N] -- go test -run '^$' -bench . -benchmem ./...
//
// Convention: the sub-benchmarks "sluice", "raw" (plain amqp091-go) and "watermill"
// (watermill-amqp or Watermill's own middleware) under one parent benchmark are one
// comparison, one row per metric. A sub-benchmark "raw-<variant>" is a variant of the raw
// reference (the raw loop doing more of sluice's work) and gets rows of its own, sluice
// beside it. Benchmarks without references get rows of their own.
//
// -rounds N runs the whole command N times and puts the median of each figure in the
// table. A round runs every variant of a comparison one after the other, so the median
// compares variants measured minutes apart at most, never one variant's good minute with
// another's bad one. The exit status is that of the first round that failed, else 0.
//
// -record FILE also writes the table into FILE between the markers
// <!-- benchtable:begin --> and <!-- benchtable:end --> (with -section S, the markers
// named S: BENCHMARKS.md has one section per RabbitMQ version), with the date, the machine
// and the broker's version as RabbitMQ at AMQP_URL reports it; the rest of FILE is kept.
// With -section S it also writes the headline rows (summary.go) between the markers named
// "summary S", when FILE has them: BENCHMARKS.md opens with one such summary per version.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sluice-go/sluice/internal/mask"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchtable", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rounds := fs.Int("rounds", 1, "run the command this many times; the table shows each figure's median")
	recordTo := fs.String("record", "", "also write the table into this file, between its benchtable markers")
	section := fs.String("section", "", "with -record, the markers' section name (\"RabbitMQ 4.3\"): one table per broker version")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	args = fs.Args()
	if len(args) == 0 || *rounds < 1 {
		fmt.Fprintln(stderr, "usage: benchtable [-rounds N] [-record FILE] -- go test -bench . [flags] [packages]")
		return 2
	}
	p := &parser{}
	status := 0
	for i := 1; i <= *rounds; i++ {
		if *rounds > 1 {
			fmt.Fprintf(stdout, "benchtable: round %d of %d\n", i, *rounds)
		}
		st, err := runOnce(args, stdin, stdout, stderr, p)
		if err != nil {
			fmt.Fprintf(stderr, "benchtable: %v\n", err)
			return 1
		}
		if st != 0 && status == 0 {
			status = st
		}
	}
	fmt.Fprintln(stdout)
	if *rounds > 1 {
		fmt.Fprintf(stdout, "Each figure is the median of %d rounds.\n\n", *rounds)
	}
	var table bytes.Buffer
	if err := render(io.MultiWriter(stdout, &table), groupResults(p.results)); err != nil {
		fmt.Fprintf(stderr, "benchtable: %v\n", err)
		return 1
	}
	if *recordTo != "" && len(p.results) > 0 {
		broker, now := brokerVersion(os.Getenv("AMQP_URL")), time.Now()
		if err := record(*recordTo, *section, broker, table.Bytes(), *rounds, now); err != nil {
			fmt.Fprintf(stderr, "benchtable: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "benchtable: table recorded in %s\n", *recordTo)
		// The summary of this broker's headline rows, at the top of the file, when it has
		// a place for it.
		var summary bytes.Buffer
		if err := renderSummary(&summary, groupResults(p.results)); err != nil {
			fmt.Fprintf(stderr, "benchtable: %v\n", err)
			return 1
		}
		if *section != "" && summary.Len() > 0 {
			switch err := record(*recordTo, summarySection(*section), broker, summary.Bytes(), *rounds, now); {
			case errors.Is(err, errNoMarkers):
			case err != nil:
				fmt.Fprintf(stderr, "benchtable: %v\n", err)
				return 1
			default:
				fmt.Fprintf(stdout, "benchtable: summary recorded in %s\n", *recordTo)
			}
		}
	}
	return status
}

// brokerVersion names the broker at url as it reports itself ("RabbitMQ 4.3.6").
func brokerVersion(url string) string {
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		return "a broker whose version could not be read (" + mask.Text(err.Error(), url) + ")"
	}
	defer conn.Close()
	product, _ := conn.Properties["product"].(string)
	version, _ := conn.Properties["version"].(string)
	if product == "" {
		product = "the broker"
	}
	return strings.TrimSpace(product + " " + version)
}

// runOnce runs the command, streams its output and feeds it to p. It returns the
// command's exit status, or an error when the command could not run at all.
func runOnce(args []string, stdin io.Reader, stdout, stderr io.Writer, p *parser) (int, error) {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin = stdin
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %q: %w", args[0], err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fmt.Fprintln(stdout, sc.Text())
		p.line(sc.Text())
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(stderr, "benchtable: reading output: %v\n", err)
		// Drain the rest so the command is not blocked writing to us.
		_, _ = io.Copy(stdout, out)
	}
	if err := cmd.Wait(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			return 0, err
		}
		fmt.Fprintf(stderr, "benchtable: %q exited with status %d; the table shows what ran\n", args[0], exit.ExitCode())
		return exit.ExitCode(), nil
	}
	return 0, nil
}
