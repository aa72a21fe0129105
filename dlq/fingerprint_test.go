package dlq_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/panics"
	"github.com/sluice-go/sluice/internal/testkit/dlqfill"
)

// panicAccount and panicLedger are two panic sites; recovered runs one under Watermill's
// recoverer, as the stack does, and returns the error it records.
func panicAccount(id string) { panic("no account for " + id) }

func panicLedger(id string) {
	var ledger map[string]int
	ledger[id]++ // a runtime error: assignment to a nil map
}

func recovered(site func(string), id string) error {
	return recoveredBy(middleware.Recoverer, site, id)
}

// recoveredBy runs site under recoverer and returns the error it records.
func recoveredBy(recoverer message.HandlerMiddleware, site func(string), id string) error {
	h := recoverer(func(*message.Message) ([]*message.Message, error) {
		site(id)
		return nil, nil
	})
	_, err := h(message.NewMessage(id, nil))
	return err
}

// The router recovers a handler's panic with its own recoverer (so it compiles no Watermill
// middleware); a user's own router may use Watermill's. A dead letter of either records the
// same error type, message and stack frames, so both land in one group.
func TestFingerprint_SameWhicheverRecovererCaughtThePanic(t *testing.T) {
	for _, site := range []struct {
		name string
		fn   func(string)
	}{{"panicAccount", panicAccount}, {"panicLedger", panicLedger}} {
		t.Run(site.name, func(t *testing.T) {
			record := func(err error) (typ, msg, fp string) {
				stack, ok := sluice.PanicStack(err)
				require.True(t, ok, "the stack is found: %v", err)
				typ, msg = sluice.ErrorType(err), sluice.ErrorMessage(err)
				return typ, msg, dlq.Fingerprint(typ, msg, stack)
			}
			wTyp, wMsg, wFP := record(recoveredBy(middleware.Recoverer, site.fn, "acct-1"))
			sTyp, sMsg, sFP := record(recoveredBy(panics.Recoverer, site.fn, "acct-1"))
			assert.Equal(t, "panic", sTyp)
			assert.Equal(t, wTyp, sTyp)
			assert.Equal(t, wMsg, sMsg)
			assert.Equal(t, wFP, sFP)
			assert.Contains(t, sFP, "panic at github.com/sluice-go/sluice/dlq_test."+site.name+" (fingerprint_test.go:")
			assert.NotContains(t, sFP, "Recoverer")
		})
	}
}

func TestNormalizeMessage(t *testing.T) {
	cases := []struct{ name, a, b string }{
		{"numbers", "gateway: 503 after 1200ms (attempt 3)", "gateway: 504 after 80ms (attempt 12)"},
		{"ids with digits", "order ord-8812 not found", "order ord-77 not found"},
		{"uuids", "payment 0b6c4d1e-2f3a-4b5c-8d9e-0a1b2c3d4e5f refused", "payment 9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a refused"},
		{"hex", "object 0xdeadbeef at 7f3a9c2b1d0e4f5a6b7c8d9e missing", "object 0x1F at 0123456789abcdef0123 missing"},
		{"only the first line", "timeout 5s\nstack of 12 lines", "timeout 30s\nother"},
		{"spaces", "too   many\tspaces 1", "too many spaces 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, dlq.NormalizeMessage(tc.a), dlq.NormalizeMessage(tc.b))
			assert.NotContains(t, dlq.NormalizeMessage(tc.a), "1200")
		})
	}
	assert.NotEqual(t, dlq.NormalizeMessage("order not found"), dlq.NormalizeMessage("order refused"))
	assert.Equal(t, "gateway: # after # (attempt #)", dlq.NormalizeMessage("gateway: 503 after 1200ms (attempt 3)"))
}

func TestFingerprint(t *testing.T) {
	errA1, errA2 := recovered(panicAccount, "acct-1"), recovered(panicAccount, "acct-2")
	errB := recovered(panicLedger, "led-1")
	stackA1, ok := sluice.PanicStack(errA1)
	require.True(t, ok)
	stackA2, _ := sluice.PanicStack(errA2)
	stackB, _ := sluice.PanicStack(errB)

	fpA := dlq.Fingerprint("panic", errA1.Error(), stackA1)
	assert.True(t, strings.HasPrefix(fpA, "panic at github.com/sluice-go/sluice/dlq_test.panicAccount (fingerprint_test.go:"), fpA)
	assert.NotContains(t, fpA, "runtime.")
	assert.NotContains(t, fpA, "Recoverer")

	cases := []struct {
		name       string
		typ, msg   string
		stack      string
		wantSameAs string
	}{
		{"the same site with another value", "panic", errA2.Error(), stackA2, fpA},
		{"a record with the panic's value only (x-error-message without the stack)", "panic", "no account for acct-3", stackA2, fpA},
		{"a record with the stack only in the message (no x-error-stack)", "panic", errA2.Error(), "", fpA},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.wantSameAs, dlq.Fingerprint(tc.typ, tc.msg, tc.stack))
		})
	}
	fpB := dlq.Fingerprint("panic", errB.Error(), stackB)
	assert.Contains(t, fpB, "panicLedger")
	assert.NotEqual(t, fpA, fpB, "two panic sites are two fingerprints")
	assert.Equal(t, dlq.NormalizeMessage("boom 1"), dlq.Fingerprint("panic", "panic occurred: \"boom 1\", stacktrace: \n", ""),
		"a panic without frames falls back to its value")
	assert.Equal(t, dlq.NormalizeMessage("gateway 503"), dlq.Fingerprint("gateway_down", "gateway 503", ""))
	assert.Len(t, dlq.GroupID("h", "t", fpA), 12)
	assert.NotEqual(t, dlq.GroupID("h1", "panic", fpA), dlq.GroupID("h2", "panic", fpA), "the handler is part of the group")
	_ = fmt.Sprint(errors.New("x"))
}

// TestSelectionRecordAgreesWithNewRecord: the record a bulk move selects on has the same
// fields as the full record, for records of every kind the tests make.
func TestSelectionRecordAgreesWithNewRecord(t *testing.T) {
	rec := dlqfill.NewRecorder(t, "payments")
	now := time.Now()
	for _, g := range mixedGroups {
		t.Run(g.name, func(t *testing.T) {
			f := dlqfill.Failure{ID: "m-1", Handler: "payments", Err: g.err(1), At: now.Add(-time.Hour)}
			if g.override != nil {
				f.Override = g.override(0)
			}
			pub := rec.Publishing(t, f)
			d := amqp091.Delivery{Headers: pub.Headers, MessageId: pub.MessageId, Body: pub.Body, Timestamp: pub.Timestamp}
			full := dlq.NewRecord(d, "payments", 3, now)
			got := dlq.SelectionRecord(d, "payments", 3, now)
			for _, pair := range [][2]any{
				{full.ID, got.ID}, {full.OriginalQueue, got.OriginalQueue}, {full.Handler, got.Handler},
				{full.ErrorType, got.ErrorType}, {full.ErrorMessage, got.ErrorMessage}, {full.ErrorStack, got.ErrorStack},
				{full.GroupID, got.GroupID}, {full.Fingerprint, got.Fingerprint}, {full.Replays, got.Replays},
				{full.FailedAt, got.FailedAt}, {full.Age, got.Age}, {full.HasAge, got.HasAge}, {full.Position, got.Position},
			} {
				assert.Equal(t, pair[0], pair[1])
			}
		})
	}
}
