// Command payments is sluice's example service: a payment consumer whose gateway fails in
// every way a real one does (see package example_payment).
//
//	payments serve   consume payments.requested until SIGINT or SIGTERM
//	payments demo    publish a mix of ~200 requests, watch them settle, print a summary
//
// Configuration comes from the environment: AMQP_URL (required by serve; unset, demo runs on
// the embedded broker),
// RETRY_MAX_RETRIES, RETRY_INITIAL_DELAY, RETRY_MAX_DELAY, RETRY_MULTIPLIER, RETRY_JITTER,
// RETRY_STATS_WINDOW (how far back the retry statistics reach, default 1h), RETRY_LEARNED
// (on: the learned retry policy),
// PAYMENTS_CONCURRENCY, PAYMENTS_QUEUE, PAYMENTS_OUTPUT_QUEUE, PAYMENTS_PARTITIONS (consume
// as that many key-partitioned queues), AMQP_QUEUE_TYPE (classic or quorum), METRICS_ADDR
// (/metrics, /healthz, /readyz, and the retry statistics and decision matrix on
// /debug/sluice/retries and /debug/sluice/policy), QUEUE_DEPTH_INTERVAL, RABBITMQ_MANAGEMENT_URL (queue depths
// with unacknowledged counts), OTEL_SERVICE_NAME and the standard OTEL_EXPORTER_OTLP_*
// variables. The demo's producer publishes through an outbox in PAYMENTS_OUTBOX_DIR and fails
// over to AMQP_SECONDARY_URL when they are set; with AMQP_SECONDARY_URL, serve consumes that
// cluster too.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

const usage = `usage: payments <command> [flags]

commands:
  serve   consume payments.requested until SIGINT or SIGTERM
  demo    publish a mix of requests, show progress, print a summary (what 'make run' runs)
`

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	cfg, err := loadConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "serve":
		return serve(ctx, cfg, args[1:])
	case "demo":
		return demo(ctx, cfg, args[1:], os.Stdout)
	case "-h", "--help", "help":
		fmt.Print(usage)
		return 0
	default:
		fmt.Fprintf(os.Stderr, "payments: unknown command %q\n%s", args[0], usage)
		return 2
	}
}

func newLogger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func serve(ctx context.Context, cfg config, args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	verbose := fs.Bool("v", false, "log at debug level")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := newLogger(level)
	cfg.embeddedFallback = false
	cfg.consumeSecondary = true
	svc, err := newService(ctx, cfg, logger, hooks{})
	if err != nil {
		logger.Error("payments: start failed", "error", err)
		return 1
	}
	logger.Info("payments: consuming", "queue", cfg.queue, "output", cfg.output, "broker", svc.broker.Name(),
		"exchange", cfg.exchange, "binding_key", cfg.bindingKey, "output_exchange", cfg.outputExchange)
	runErr := svc.run(ctx)
	if cerr := svc.close(); cerr != nil && !errors.Is(cerr, context.Canceled) {
		logger.Warn("payments: close", "error", cerr)
	}
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		logger.Error("payments: stopped", "error", runErr)
		return 1
	}
	logger.Info("payments: stopped")
	return 0
}
