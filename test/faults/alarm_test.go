//go:build faults

package faults

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
)

// Scenario 5 numbers.
const (
	// alarmHold is how long each alarm lasts: longer than three heartbeats.
	alarmHold = 3*serverHeartbeat + 3*time.Second
	// probeDeadline is the deadline of a publish made under the alarm.
	probeDeadline = 3 * time.Second
	// alarmBacklog is what the consumers work through during an alarm.
	alarmBacklog = 300
	// alarmWork is a handler call's duration: the backlog lasts beyond the alarm.
	alarmWork = 40 * time.Millisecond
	// closeBound is how long Broker.Close may take while blocked: it must not hang.
	closeBound = 10 * time.Second
)

// TestAlarms is scenario 5: a memory alarm, then a disk alarm, each held past three
// heartbeats. A publish under the alarm fails after its deadline with ErrBlocked (never
// hangs, never succeeds), Broker.Close returns while blocked, consumers keep acking on their
// own connection, no connection is lost, and everything resumes when the alarm clears.
func TestAlarms(t *testing.T) {
	node := startNode(t)
	rabbit := node.Rabbit(t)
	base := takeBaseline(t, node)

	sc := newScenario(t, "faults.alarm")
	l, queue := sc.l, sc.queue
	// The handlers pause from before the backlog is published until the alarm is raised,
	// so that there is work to do under the alarm however slowly the node raises it.
	var gate sync.RWMutex
	rcfg := sc.config(2, 4)
	rcfg.HandlerTimeout = 3 * time.Minute
	st := startStack(t, amqp.Config{URLs: []string{node.URL()}}, rcfg,
		gatedWorkload(l, queue, alarmWork, &gate))

	alarms := []struct {
		name       string
		set, clear []string
	}{
		{"memory", []string{"set_vm_memory_high_watermark", "0.0000001"}, []string{"set_vm_memory_high_watermark", "0.4"}},
		{"disk", []string{"set_disk_free_limit", "1000000000000000"}, []string{"set_disk_free_limit", "50000000"}},
	}
	for _, a := range alarms {
		t.Run(a.name, func(t *testing.T) {
			ids := make([]string, alarmBacklog)
			for i := range ids {
				ids[i] = fmt.Sprintf("%s-backlog-%05d", a.name, i)
			}
			gate.Lock()
			paused := true
			defer func() {
				if paused {
					gate.Unlock()
				}
			}()
			publishAll(l, st.broker.Publisher(), queue, ids, 100, 4, 30*time.Second)
			before := connectionPids(t, node)

			ctl(t, node, a.set...)
			cleared := false
			defer func() {
				if !cleared {
					ctl(t, node, a.clear...)
				}
			}()
			require.Eventually(t, func() bool { return alarmOn(t, node) }, 30*time.Second, 100*time.Millisecond, "%s alarm raised", a.name)
			gate.Unlock()
			paused = false
			raised := time.Now()
			effectsAtAlarm := l.count(func(r *record) bool { return r.effects > 0 })
			t.Logf("%s alarm raised with %d messages waiting", a.name, rabbit.Count(queue))

			// A publish under the alarm: it fails after its deadline, naming the block.
			probe := fmt.Sprintf("%s-probe", a.name)
			ctx, cancel := context.WithTimeout(context.Background(), probeDeadline)
			begin := time.Now()
			err := st.broker.Publisher().PublishTo(ctx, "", queue, msg(probe))
			took := time.Since(begin)
			cancel()
			l.published(probe, err)
			require.Error(t, err, "a publish under the %s alarm never reports success", a.name)
			t.Logf("publish under the %s alarm: %v (after %s)", a.name, err, took.Round(time.Millisecond))
			assert.ErrorIs(t, err, broker.ErrBlocked)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Less(t, took, probeDeadline+2*time.Second, "the publish returned at its deadline")

			// Close on a blocked broker returns.
			closeBlocked(t, node, l, queue, a.name)

			// Consumers ack through the alarm on their own connection.
			require.Eventually(t, func() bool {
				return l.count(func(r *record) bool { return r.effects > 0 }) >= effectsAtAlarm+50
			}, alarmHold, 100*time.Millisecond, "consumers keep working under the %s alarm", a.name)
			time.Sleep(time.Until(raised.Add(alarmHold)))
			require.True(t, alarmOn(t, node), "the %s alarm was held for %s", a.name, alarmHold)
			assert.Equal(t, before, connectionPids(t, node), "no connection lost or replaced under the %s alarm", a.name)

			ctl(t, node, a.clear...)
			cleared = true
			require.Eventually(t, func() bool { return !alarmOn(t, node) }, 30*time.Second, 100*time.Millisecond, "%s alarm cleared", a.name)
			resumed := time.Now()
			after := []string{a.name + "-after-1", a.name + "-after-2", a.name + "-after-3"}
			publishAll(l, st.broker.Publisher(), queue, after, 1, 3, 30*time.Second)
			for _, id := range after {
				require.Equal(t, confirmed, l.m[id].publish, "publish of %s after the alarm", id)
			}
			t.Logf("publishing resumed %s after the %s alarm cleared", time.Since(resumed).Round(time.Millisecond), a.name)
			waitSettled(t, l, rabbit, queue, 2*time.Minute)
		})
	}
	st.close()
	s := l.check(t, 1)
	t.Logf("alarms: %d publishes failed with ErrBlocked, %d confirmed, lost %d, duplicates %d", s.Failed, s.Confirmed, s.Lost, s.Duplicates)
	_ = sc.guard.Close()
	base.verify(t)
}

// closeBlocked connects a second broker, gets its publishing connection blocked, and
// checks that Close returns within closeBound.
func closeBlocked(t *testing.T, node *testenv.Node, l *ledger, queue, alarm string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := amqp.New(ctx, amqp.Config{URLs: []string{node.URL()}, Logger: logger()})
	require.NoError(t, err)
	id := alarm + "-close-probe"
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	err = b.Publisher().PublishTo(pctx, "", queue, msg(id))
	pcancel()
	l.published(id, err)
	require.ErrorIs(t, err, broker.ErrBlocked)
	begin := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case err := <-closed:
		t.Logf("Broker.Close under the %s alarm took %s (%v)", alarm, time.Since(begin).Round(time.Millisecond), err)
	case <-time.After(closeBound):
		t.Fatalf("Broker.Close still blocked %s into the %s alarm", closeBound, alarm)
	}
}

// ctl runs rabbitmqctl on node and fails t on error.
func ctl(t *testing.T, node *testenv.Node, args ...string) string {
	t.Helper()
	out, err := node.Ctl(args...)
	require.NoError(t, err, "rabbitmqctl %s: %s", strings.Join(args, " "), out)
	return out
}

// alarmOn reports whether node has a resource alarm.
func alarmOn(t *testing.T, node *testenv.Node) bool {
	out := ctl(t, node, "eval", "rabbit_alarm:get_alarms().")
	return strings.TrimSpace(out) != "[]"
}

// connectionPids lists node's connections, to tell a kept connection from a replaced one.
func connectionPids(t *testing.T, node *testenv.Node) []string {
	out := ctl(t, node, "-q", "--no-table-headers", "list_connections", "pid")
	var pids []string
	for _, line := range strings.Split(out, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			pids = append(pids, line)
		}
	}
	sort.Strings(pids)
	return pids
}
