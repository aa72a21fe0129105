package test

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/broker/amqp"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/topology"
	"github.com/sluice-go/sluice/middleware/retry"
	"github.com/sluice-go/sluice/router"
)

// TestDLQCompensatedCLI is issue 54's operator story for a saga: a payment handler with a
// compensation (router.WithCompensation) gives up on three payments; two are compensated
// (an order-cancel event each), one is not (its builder fails). `sluice dlq show` names the
// event and where it went, or why none went; `replay` and `edit` refuse a compensated
// dead letter (exit 2, it stays in the DLQ, the rest of a selection moves) until
// --compensated confirms it; `sluice audit` records the confirmation.
func TestDLQCompensatedCLI(t *testing.T) {
	t.Parallel() // its own queues on the shared node: see the package doc
	e := rabbitEnv(t)
	run := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)
	queue, cancels := e.newQueue(t, "comp.payments"), e.newQueue(t, "comp.orders.cancel")
	dlqName, archive := topology.DLQ(queue), topology.Archive(queue)
	e.rabbit.DeleteQueues(archive)
	t.Cleanup(func() { e.rabbit.DeleteQueues(archive) })

	var healed atomic.Bool
	var mu sync.Mutex
	processed := map[string]int{}
	handler := func(m *message.Message) error {
		if !healed.Load() {
			return sluice.Permanent(errors.New("card declined: " + m.UUID))
		}
		mu.Lock()
		processed[m.UUID]++
		mu.Unlock()
		return nil
	}
	build := func(msg, record *message.Message) (*message.Message, error) {
		if strings.HasPrefix(msg.UUID, "nocomp-") {
			return nil, errors.New("no order id in " + msg.UUID)
		}
		return message.NewMessage("set-by-sluice", []byte(`{"cancel_order_of":"`+msg.UUID+`"}`)), nil
	}
	start(t, e, router.Config{Retry: retry.Config{MaxRetries: 1, InitialDelay: 50 * time.Millisecond, Jitter: retry.NoJitter}}, func(st *router.Stack) {
		require.NoError(t, st.Handle("pay", queue, handler, router.WithCompensation(router.Compensation{Queue: cancels, Build: build})))
	})
	pay1, pay2, nocomp := "pay-1-"+run, "pay-2-"+run, "nocomp-"+run
	for _, id := range []string{pay1, pay2, nocomp} {
		e.publish(t, queue, message.NewMessage(id, []byte(`{"id":"`+id+`"}`)))
	}
	require.Eventually(t, func() bool { return e.rabbit.Count(dlqName) == 3 && e.rabbit.Count(cancels) == 2 },
		30*time.Second, 50*time.Millisecond, "three dead letters, two compensation events")
	events := map[string]string{} // compensated message id -> its event's id
	for range 2 {
		d, ok := e.rabbit.Get(cancels)
		require.True(t, ok)
		ev, err := amqp.Marshaler{}.Unmarshal(d)
		require.NoError(t, err)
		var body struct {
			Of string `json:"cancel_order_of"`
		}
		require.NoError(t, json.Unmarshal(ev.Payload, &body))
		events[body.Of] = ev.UUID
	}
	bin := sluiceCLI(t)
	sluiceRun := func(args ...string) cliRun { return runSluice(t, bin, e.rabbit.URL, args...) }

	t.Run("show names the compensation", func(t *testing.T) {
		tests := []struct {
			id   string
			want string
		}{
			{pay1, "event " + events[pay1] + " published to queue " + cancels + " (replay and edit need --compensated"},
			{nocomp, "not published: no order id in " + nocomp},
		}
		for _, tt := range tests {
			res := sluiceRun("dlq", "show", "--queue", queue, tt.id)
			require.Zero(t, res.code, res)
			assert.Regexp(t, `\n  compensation:\s+`+regexp.QuoteMeta(tt.want), res.stdout, res)
		}
		res := sluiceRun("dlq", "show", "--queue", queue, "--json", pay1)
		require.Zero(t, res.code, res)
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &rec))
		assert.Equal(t, events[pay1], rec["compensation_id"])
		assert.Equal(t, "queue "+cancels, rec["compensation_to"])
	})

	t.Run("the help documents --compensated", func(t *testing.T) {
		for _, cmd := range []string{"replay", "edit"} {
			res := sluiceRun("dlq", cmd, "-h")
			assert.Zero(t, res.code, res)
			assert.Contains(t, res.stdout, "-compensated", res)
			assert.Contains(t, res.stdout, "unless --compensated confirms it", res)
		}
	})

	healed.Store(true)
	t.Run("refused without --compensated", func(t *testing.T) {
		tests := []struct {
			name string
			args []string
		}{
			{"replay by id", []string{"replay", "--id", pay1}},
			{"edit", []string{"edit", "--id", pay2, "--set-header", "x-ticket=OPS-7"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				res := sluiceRun(append([]string{"dlq"}, append(tt.args, "--queue", queue)...)...)
				assert.Equal(t, 2, res.code, res)
				assert.Contains(t, res.stderr, "compensation was published", res)
				assert.Contains(t, res.stderr, "--compensated confirms it", res)
				assert.Equal(t, 3, e.rabbit.Count(dlqName), "nothing left the DLQ")
			})
		}
	})

	t.Run("a selection replays all but the compensated", func(t *testing.T) {
		res := sluiceRun("dlq", "replay", "--queue", queue, "--all")
		assert.Equal(t, 2, res.code, res)
		assert.Contains(t, res.stdout, "replayed 1 of 3 messages read from "+dlqName, res)
		assert.Contains(t, res.stdout, "not replayed, still in "+dlqName+": "+pay1, res)
		assert.Contains(t, res.stdout, "compensated messages stay in "+dlqName, res)
		require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return processed[nocomp] == 1 }, 30*time.Second, 50*time.Millisecond)
		assert.Equal(t, 2, e.rabbit.Count(dlqName))
	})

	t.Run("accepted with --compensated", func(t *testing.T) {
		res := sluiceRun("dlq", "replay", "--queue", queue, "--id", pay1, "--compensated")
		require.Zero(t, res.code, res)
		assert.Contains(t, res.stdout, "replayed 1 message(s) whose compensation event was published (confirmed with --compensated)", res)
		res = sluiceRun("dlq", "edit", "--queue", queue, "--id", pay2, "--set-header", "x-ticket=OPS-7", "--compensated")
		require.Zero(t, res.code, res)
		assert.Contains(t, res.stdout, "edited "+pay2, res)
		assert.Contains(t, res.stdout, "its compensation event had been published (confirmed with --compensated)", res)
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return processed[pay1] == 1 && processed[pay2] == 1
		}, 30*time.Second, 50*time.Millisecond, "both processed again")
		assert.Zero(t, e.rabbit.Count(dlqName))
		assert.Zero(t, e.rabbit.Count(cancels), "healed: no new compensation")
	})

	t.Run("the audit trail records the confirmation", func(t *testing.T) {
		res := sluiceRun("audit", "--queue", queue, "--json")
		require.Zero(t, res.code, res)
		var got []dlq.AuditEvent
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &got), res)
		var rows []string
		for _, ev := range got {
			rows = append(rows, fmt.Sprintf("%s %s %s count=%d compensated=%d confirmed=%t",
				ev.Action, ev.Result, ev.Selector, ev.Count, ev.Compensated, ev.ConfirmedCompensated))
		}
		assert.Equal(t, []string{
			"replay failed --id " + pay1 + " count=0 compensated=0 confirmed=false",
			"edit failed --id " + pay2 + " count=0 compensated=0 confirmed=false",
			"replay failed --all count=1 compensated=0 confirmed=false",
			"replay ok --id " + pay1 + " count=1 compensated=1 confirmed=true",
			"edit ok --id " + pay2 + " count=1 compensated=1 confirmed=true",
		}, rows)
		table := sluiceRun("audit", "--queue", queue)
		require.Zero(t, table.code, table)
		assert.Contains(t, table.stdout, "--id "+pay1+" --compensated")
	})
}
