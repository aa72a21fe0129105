package policy_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-go/sluice/broker/memory"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/policy"
	"github.com/sluice-go/sluice/router"
)

// newStack is a service's stack: one handler, two retries 1 s then 2 s after a failure.
func newStack() (*router.Stack, func()) {
	quiet := slog.New(slog.DiscardHandler)
	b := memory.New(memory.Config{Logger: quiet})
	s, err := router.New(b, router.Config{
		Logger: quiet,
		Retry:  retry.Config{MaxRetries: 2, InitialDelay: time.Second, Multiplier: 2, Jitter: retry.NoJitter},
	})
	if err != nil {
		panic(err)
	}
	if err := s.Handle("charge", "payments", func(*message.Message) error { return nil }); err != nil {
		panic(err)
	}
	return s, func() { _ = s.Close(); _ = b.Close() }
}

// A tool's side: the service serves its stack's Description as JSON (otelsetup's debug
// handler, on GET /debug/sluice/policy), and the tool reads it back into a Description,
// durations included.
func Example() {
	s, done := newStack()
	defer done()
	body, err := json.Marshal(s.Describe()) // what the endpoint serves, without the HTTP round trip
	if err != nil {
		panic(err)
	}

	var d policy.Description
	if err := json.Unmarshal(body, &d); err != nil {
		panic(err)
	}
	for _, h := range d.Handlers {
		fmt.Printf("%s: %s, dead letters to %s, %d attempts\n", h.Name, h.Queue, h.DeadLetterQueue, h.Retry.MaxAttempts)
		for _, r := range h.Retry.Schedule {
			fmt.Printf("  retry %d after %v (%v after the first failure)\n", r.Retry, r.Delay, r.Elapsed)
		}
		for _, c := range h.ErrorClasses {
			if c.Class == "permanent" {
				fmt.Println("  permanent:", c.Action)
			}
		}
	}
	// Output:
	// charge: payments, dead letters to payments.dlq, 3 attempts
	//   retry 1 after 1s (1s after the first failure)
	//   retry 2 after 2s (3s after the first failure)
	//   permanent: dead-lettered to payments.dlq at once
}

// The runbook's side: Markdown renders the same description as a section per handler,
// each with tables of its settings, its error classes and its delay schedule.
func ExampleDescription_Markdown() {
	s, done := newStack()
	defer done()
	md := s.Describe().Markdown()
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "#") || strings.HasPrefix(line, "| Settle bound") ||
			strings.HasPrefix(line, "| Maximum attempts") || strings.HasPrefix(line, "| Compensation") ||
			strings.HasPrefix(line, "| Backoff") || strings.HasPrefix(line, "| 1 |") || strings.HasPrefix(line, "| 2 |") {
			fmt.Println(line)
		}
	}
	// Output:
	// # Retry decision matrix
	// ## Handler `charge`
	// | Settle bound | every delivery settled within 1m41s of its delivery, prefetch wait included; RabbitMQ's consumer timeout must not be lower |
	// | Maximum attempts | 3 (2 retries) |
	// | Backoff | 1s × 2 up to 1m, jitter ±0% |
	// | Compensation | none |
	// | 1 | 2 | 1s | 1s – 1s | 1s |
	// | 2 | 3 | 2s | 2s – 2s | 3s |
}

// Duration is how the description writes durations in JSON: a Go duration, without the
// zero minutes and seconds time.Duration's String keeps.
func ExampleDuration() {
	out, _ := json.Marshal(struct {
		Window policy.Duration `json:"window"`
	}{policy.Duration(24 * time.Hour)})
	fmt.Println(string(out))

	var d policy.Duration
	_ = json.Unmarshal([]byte(`"2h"`), &d)
	fmt.Println(time.Duration(d), d)
	// Output:
	// {"window":"24h"}
	// 2h0m0s 2h
}
