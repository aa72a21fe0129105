// Command benchtable runs a `go test -bench` command, streams its output, and then prints
// one table in which each sluice figure stands beside its references and the ratio.
//
//	go run ./internal/benchtable -- go test -run '^$' -bench . -benchmem ./...
//
// Convention: the sub-benchmarks "sluice", "raw" (plain amqp091-go) and "watermill"
// (watermill-amqp or Watermill's own middleware) under one parent benchmark are one
// comparison, one row per metric. Benchmarks without references get rows of their own.
// The exit status is the command's.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: benchtable -- go test -bench . [flags] [packages]")
		return 2
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin = stdin
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintf(stderr, "benchtable: %v\n", err)
		return 1
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "benchtable: start %q: %v\n", args[0], err)
		return 1
	}
	p := &parser{}
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
	status := 0
	if err := cmd.Wait(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			fmt.Fprintf(stderr, "benchtable: %v\n", err)
			return 1
		}
		status = exit.ExitCode()
		fmt.Fprintf(stderr, "benchtable: %q exited with status %d; the table shows what ran\n", args[0], status)
	}
	fmt.Fprintln(stdout)
	if err := render(stdout, groupResults(p.results)); err != nil {
		fmt.Fprintf(stderr, "benchtable: %v\n", err)
		return 1
	}
	return status
}
