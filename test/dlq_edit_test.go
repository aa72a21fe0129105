package test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/handlers/example_payment"
	"github.com/sluice-go/sluice/internal/dlqwire"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// TestDLQEditPayment is issue 37's operator story on the payments service: a payment
// dead-lettered for an invalid field is corrected with `sluice dlq edit` and charged once;
// replaying the corrected copy again is absorbed by the idempotency step; every refused
// edit changes nothing; `sluice audit` lists what was done and by whom.
func TestDLQEditPayment(t *testing.T) {
	t.Parallel() // its own queues on the shared node: see the package doc
	r := testenv.NewRabbit(t)
	queue, output := testenv.Name("edit.payments.requested"), testenv.Name("edit.payments.succeeded")
	dlqName, archive := topology.DLQ(queue), topology.Archive(queue)
	r.DeleteQueues(queue, dlqName, archive, output, topology.DLQ(output))
	startPayments(t, fastPaymentsEnv(r.URL, queue, output))
	waitQueue(t, r, queue)
	waitQueue(t, r, output)
	events := collectEvents(t, r, output)
	bin := sluiceCLI(t)

	run := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)
	payment, msgID := "pay_edit_"+run, "m-edit-"+run
	bad := []byte(fmt.Sprintf(`{"payment_id":%q,"order_id":"ord_1","amount_cents":1299,"currency":"eur","source":"tok_visa"}`, payment))
	r.Publish(queue, amqp091.Publishing{MessageId: msgID, CorrelationId: "corr-" + run, ContentType: "application/json",
		DeliveryMode: amqp091.Persistent, Body: bad})
	require.Eventually(t, func() bool { return r.Count(dlqName) == 1 }, 60*time.Second, 50*time.Millisecond, "the invalid payment is dead-lettered")
	show := runSluice(t, bin, r.URL, "dlq", "show", "--queue", queue, "--json", msgID)
	require.Zero(t, show.code, show)
	assert.Contains(t, show.stdout, example_payment.ErrorTypeValidation)

	dir := t.TempDir()
	file := func(name string, body []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, body, 0o600))
		return p
	}
	good := []byte(strings.Replace(string(bad), `"eur"`, `"EUR"`, 1))

	t.Run("refused edits change nothing", func(t *testing.T) {
		cases := []struct {
			name string
			args []string
			code int
			text string
		}{
			{"invalid JSON", []string{"--id", msgID, "--payload-file", file("broken.json", []byte(`{"payment_id": "x"`))}, 2, "not valid JSON"},
			{"oversized payload", []string{"--id", msgID, "--payload-file", file("big.json", []byte(`"`+strings.Repeat("a", dlqwire.MaxEditPayload)+`"`))}, 2, "over the 1048576-byte limit"},
			{"failure record header", []string{"--id", msgID, "--set-header", sluice.HeaderErrorType + "=none"}, 2, "cannot be edited"},
			{"missing id", []string{"--id", "no-such-" + run, "--payload-file", file("ok.json", good)}, 3, "not found"},
			{"no payload nor header", []string{"--id", msgID}, 2, "nothing to change"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				res := runSluice(t, bin, r.URL, append([]string{"dlq", "edit", "--queue", queue}, tc.args...)...)
				assert.Equal(t, tc.code, res.code, res)
				assert.Contains(t, res.stderr, tc.text, res)
				assert.Equal(t, 1, r.Count(dlqName), "the original is still in the DLQ")
				assert.Zero(t, r.Count(archive))
			})
		}
	})

	t.Run("edit and charge once", func(t *testing.T) {
		res := runSluice(t, bin, r.URL, "dlq", "edit", "--queue", queue, "--id", msgID, "--payload-file", file("good.json", good),
			"--set-header", "x-fixed-ticket=OPS-42")
		require.Zero(t, res.code, res)
		assert.Contains(t, res.stdout, "edited "+msgID+": replayed to "+queue+" as id "+msgID)
		require.Eventually(t, func() bool { return len(events()) == 1 }, 30*time.Second, 50*time.Millisecond, "the corrected payment is charged")
		assert.Equal(t, payment, events()[0].ev.PaymentID)
		assert.Equal(t, "EUR", events()[0].ev.Currency)
		assert.Zero(t, r.Count(dlqName))
		require.Equal(t, 1, r.Count(archive), "the original is archived")
		orig, ok := r.Get(archive)
		require.True(t, ok)
		assert.Equal(t, bad, orig.Body, "archived byte for byte")
		r.Publish(archive, amqp091.Publishing{MessageId: orig.MessageId, Headers: orig.Headers, ContentType: orig.ContentType, Body: orig.Body})
	})

	t.Run("a replay of a charged payment is absorbed", func(t *testing.T) {
		// The corrected copy dead-lettered again after its effect (say, by an operator's
		// mistake): its replay keeps the key the idempotency step holds as done.
		r.Publish(dlqName, amqp091.Publishing{MessageId: msgID, ContentType: "application/json", Body: good,
			Headers: amqp091.Table{sluice.HeaderOriginalQueue: queue, sluice.HeaderErrorType: "operator_test"}})
		res := runSluice(t, bin, r.URL, "dlq", "replay", "--queue", queue, "--id", msgID)
		require.Zero(t, res.code, res)
		require.Eventually(t, func() bool { return r.Count(queue) == 0 && r.Count(dlqName) == 0 }, 30*time.Second, 50*time.Millisecond)
		time.Sleep(time.Second) // a second charge's event would show now
		assert.Len(t, events(), 1, "charged once")
	})

	t.Run("audit lists each action with its actor", func(t *testing.T) {
		res := runSluice(t, bin, r.URL, "audit", "--queue", queue, "--since", "10m", "--json")
		require.Zero(t, res.code, res)
		var got []dlq.AuditEvent
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &got), res)
		var rows []string
		for _, ev := range got {
			rows = append(rows, fmt.Sprintf("%s %s %s count=%d ids=%v", ev.Action, ev.Result, ev.Selector, ev.Count, ev.IDs))
			assert.Equal(t, osActor(t), ev.Actor, "the CLI's OS user and host")
		}
		assert.Equal(t, []string{
			// Invalid JSON is found once the message is read (its content type): an action
			// that failed. The other refusals are refused before any action.
			fmt.Sprintf("edit failed --id %s count=0 ids=[]", msgID),
			fmt.Sprintf("edit failed --id no-such-%s count=0 ids=[]", run),
			fmt.Sprintf("edit ok --id %s count=1 ids=[%s]", msgID, msgID),
			fmt.Sprintf("replay ok --id %s count=1 ids=[%s]", msgID, msgID),
		}, rows)
		table := runSluice(t, bin, r.URL, "audit", "--queue", queue)
		require.Zero(t, table.code, table)
		assert.Contains(t, table.stdout, "ACTOR")
		assert.Contains(t, table.stdout, osActor(t))
	})
}

// osActor is the actor the audit trail names for the CLI: the OS user and host name
// ("alice@host").
func osActor(t *testing.T) string {
	t.Helper()
	u, err := user.Current()
	require.NoError(t, err)
	host, err := os.Hostname()
	require.NoError(t, err)
	return u.Username + "@" + host
}
