package main

import (
	"fmt"
	"io"
	"strings"
)

// headline is one line of the summary: the table row of benchmark label and unit, under a
// title a reader recognises.
type headline struct {
	label, unit, title string
}

// headlines are the summary's lines, in order: what a team comparing sluice with what it
// runs today looks at first (issue 55), every default on unless the title says otherwise.
var headlines = []headline{
	{"router Consume", "msgs/s", "consume, handler that does nothing, 8 at a time, prefetch 64 (msgs/s)"},
	{"router Consume (nojournal)", "msgs/s", "the same, idempotency journal off (msgs/s)"},
	{"router Consume", "broker-cpu-ms/kmsg", "consume: the broker's CPU per 1,000 messages (ms)"},
	{"router Consume", "cpu-ms/kmsg", "consume: this process's CPU per 1,000 messages (ms)"},
	{"router Consume (nojournal)", "broker-cpu-ms/kmsg", "consume, journal off: the broker's CPU per 1,000 messages (ms)"},
	{"router Consume (nojournal)", "cpu-ms/kmsg", "consume, journal off: this process's CPU per 1,000 messages (ms)"},
	{"router Consume", "records/append", "consume: idempotency records per journal append"},
	{"router SlowHandler32", "msgs/s", "handler that waits 2 ms, 32 at a time (msgs/s)"},
	{"router SlowHandler32 (nojournal)", "msgs/s", "the same, journal off (msgs/s)"},
	{"router SlowHandler32", "broker-cpu-ms/kmsg", "2 ms handler at 32: the broker's CPU per 1,000 messages (ms)"},
	{"router SlowHandler32 (nojournal)", "broker-cpu-ms/kmsg", "2 ms handler at 32, journal off: the broker's CPU per 1,000 messages (ms)"},
	{"broker/amqp JournalAppend/alone", "broker-cpu-us/append", "one journal append of 16 records, confirmed, nobody following the stream: the broker's CPU (µs)"},
	{"broker/amqp JournalAppend/follow-others", "broker-cpu-us/append", "the same, the instance's own follower running as it does (4.3: reads markers only; 3.10: is sent every record back) (µs)"},
	{"broker/amqp JournalAppend/follow-all", "broker-cpu-us/append", "the same, a follower reading every record back, as before issue 55 (µs)"},
	{"router RetryPath vs raw-record", "msgs/s", "every message fails once: confirmed hand-off to the delay, retry (msgs/s; raw: the raw loop sending the same failure record)"},
	{"router RetryPath vs raw-record", "broker-cpu-ms/kmsg", "retry path: the broker's CPU per 1,000 messages (ms)"},
	{"router RetryPath vs raw-record", "cpu-ms/kmsg", "retry path: this process's CPU per 1,000 messages (ms)"},
	{"router RetryPath (untraced) vs raw-record", "msgs/s", "the same, telemetry off (three spans a message fewer) (msgs/s)"},
	{"router RetryPath (untraced) vs raw-record", "cpu-ms/kmsg", "retry path, telemetry off: this process's CPU per 1,000 messages (ms)"},
	{"router RetryPath (nojournal) vs raw-record", "msgs/s", "the same, telemetry on, journal off (msgs/s)"},
	{"broker/amqp DelayAccuracy", "p99-late-ms", "240 delays handed off at once by a new broker: p99 lateness (ms)"},
	{"broker/amqp DelayAccuracy/warm", "p99-late-ms", "240 at once, a broker that delayed before: p99 lateness (ms)"},
	{"broker/amqp DelayAccuracy/alone", "p99-late-ms", "one delay at a time: p99 lateness (ms)"},
}

// renderSummary writes the headline rows found among groups' rows as one table; it
// writes nothing when none is there.
func renderSummary(w io.Writer, groups []*group) error {
	byKey := map[string]row{}
	for _, g := range groups {
		for _, r := range g.rows() {
			byKey[r.benchmark+"\x00"+r.unit] = r
		}
	}
	var sb strings.Builder
	for _, h := range headlines {
		r, ok := byKey[h.label+"\x00"+h.unit]
		if !ok {
			continue
		}
		if sb.Len() == 0 {
			sb.WriteString("| what | sluice | raw amqp091 | watermill-amqp | sluice÷raw | sluice÷watermill |\n")
			sb.WriteString("| --- | ---: | ---: | ---: | ---: | ---: |\n")
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s |\n", h.title, r.sluice, r.refs[0], r.refs[1], r.ratios[0], r.ratios[1])
	}
	_, err := io.WriteString(w, sb.String())
	return err
}
