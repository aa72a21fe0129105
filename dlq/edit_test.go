package dlq_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/dlqwire"
	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// auditedOperator returns an Operator acting as actor that records on an audit exchange of
// the test's own, removed when t ends.
func auditedOperator(t *testing.T, fx *fixture, actor string) dlq.Operator {
	t.Helper()
	o := dlq.Operator{Conn: fx.conn, Actor: actor, AuditExchange: testenv.Name("test.audit")}
	t.Cleanup(func() {
		fx.rabbit.DeleteQueues(o.AuditExchange)
		if ch, err := fx.rabbit.Conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(o.AuditExchange, false, false)
			_ = ch.Close()
		}
	})
	return o
}

func TestOperatorEdit(t *testing.T) {
	for _, qt := range queueTypes {
		t.Run(string(qt), func(t *testing.T) {
			fx := newFixture(t, qt)
			archive := topology.Archive(fx.queue)
			t.Cleanup(func() { fx.rabbit.DeleteQueues(archive) })
			for _, id := range []string{"pay-a", "pay-b", "pay-c"} {
				fx.deadLetter(t, failure{id: id, err: invalidAmount(), retries: 2, md: map[string]string{"x-source": "checkout"}})
			}
			original := fx.peekDeliveries(t, fx.dlq)[1]
			o := auditedOperator(t, fx, "alice@ops")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			payload := []byte(`{"id":"pay-b","amount":12.5}`)
			res, err := o.Edit(ctx, fx.queue, dlq.Edit{ID: "pay-b", Payload: payload,
				SetHeaders: map[string]string{"tenant": "globex"}, UnsetHeaders: []string{"x-source"}}, dlq.Options{})
			require.NoError(t, err)
			sum := sha256.Sum256(original.Body)
			assert.Equal(t, 1, res.Moved)
			assert.Equal(t, fx.queue, res.Destination)
			assert.Equal(t, archive, res.Archive)
			assert.Equal(t, hex.EncodeToString(sum[:]), res.OriginalSHA256)

			// The corrected copy is in Q, ready to be handled again from scratch.
			got := fx.take(t, fx.queue)
			require.Len(t, got, 1)
			c := got[0]
			assert.Equal(t, "pay-b", idOf(c))
			assert.JSONEq(t, string(payload), string(c.Body))
			assert.Equal(t, "corr-pay-b", c.CorrelationId)
			assert.Equal(t, original.Headers[headers.TraceParent], c.Headers[headers.TraceParent])
			assert.Equal(t, "globex", c.Headers["tenant"])
			assert.NotContains(t, c.Headers, "x-source")
			assert.NotContains(t, c.Headers, sluice.HeaderRetryCount, "the copy starts over")
			assert.NotContains(t, c.Headers, sluice.HeaderErrorType)
			assert.Equal(t, "1", c.Headers[headers.ReplayCount])
			assert.Equal(t, "alice@ops", c.Headers[headers.EditedBy])
			assert.NotEmpty(t, c.Headers[headers.EditedAt])
			assert.Equal(t, res.OriginalSHA256, c.Headers[headers.OriginalSHA256])
			history, _ := c.Headers[sluice.HeaderRetryHistory].(string)
			assert.Contains(t, history, "replayed from "+fx.dlq, "the failure history is kept and the replay added")

			// The original is archived unchanged; the others stay in the DLQ in order.
			arch := fx.take(t, archive)
			require.Len(t, arch, 1)
			assert.Equal(t, original.Body, arch[0].Body)
			assert.Equal(t, original.Headers[sluice.HeaderErrorType], arch[0].Headers[sluice.HeaderErrorType])
			assert.Equal(t, []string{"pay-a", "pay-c"}, fx.peek(t, fx.dlq))

			// Recorded: who, what, how many.
			events, err := dlq.ReadAudit(ctx, fx.conn, dlq.AuditQuery{Exchange: o.AuditExchange})
			require.NoError(t, err)
			require.Len(t, events, 1)
			assert.Equal(t, "edit", events[0].Action)
			assert.Equal(t, []string{"pay-b"}, events[0].IDs)
			assert.Equal(t, 1, events[0].Count)
			assert.Equal(t, "alice@ops", events[0].Actor)
			assert.Equal(t, "ok", events[0].Result)
		})
	}
}

func TestOperatorEditRefused(t *testing.T) {
	fx := newFixture(t, queueTypes[0])
	archive := topology.Archive(fx.queue)
	t.Cleanup(func() { fx.rabbit.DeleteQueues(archive) })
	for _, id := range []string{"pay-a", "pay-b"} {
		fx.deadLetter(t, failure{id: id, err: invalidAmount()})
	}
	o := auditedOperator(t, fx, "bob@ops")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	tests := []struct {
		name string
		edit dlq.Edit
		want error
		text string
	}{
		{"invalid JSON", dlq.Edit{ID: "pay-a", Payload: []byte(`{"amount": 12.5`)}, dlq.ErrEditRefused, "not valid JSON"},
		{"oversized payload", dlq.Edit{ID: "pay-a", Payload: []byte(`"` + strings.Repeat("x", dlqwire.MaxEditPayload) + `"`)}, dlq.ErrEditRefused, "over the 1048576-byte limit"},
		{"oversized header", dlq.Edit{ID: "pay-a", SetHeaders: map[string]string{"note": strings.Repeat("x", dlqwire.MaxEditHeaderValue+1)}}, dlq.ErrEditRefused, "over the 4096-byte limit"},
		{"failure record header", dlq.Edit{ID: "pay-a", SetHeaders: map[string]string{sluice.HeaderErrorType: "none"}}, dlq.ErrEditRefused, "cannot be edited"},
		{"message id header", dlq.Edit{ID: "pay-a", UnsetHeaders: []string{headers.UUID}}, dlq.ErrEditRefused, "cannot be edited"},
		{"nothing to change", dlq.Edit{ID: "pay-a"}, dlq.ErrEditRefused, "nothing to change"},
		{"missing id", dlq.Edit{ID: "pay-gone", Payload: []byte(`{}`)}, dlq.ErrMessageNotFound, `"pay-gone"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := o.Edit(ctx, fx.queue, tt.edit, dlq.Options{})
			require.ErrorIs(t, err, tt.want)
			assert.Contains(t, err.Error(), tt.text)
			assert.Equal(t, []string{"pay-a", "pay-b"}, fx.peek(t, fx.dlq), "nothing left the DLQ")
			assert.Zero(t, fx.rabbit.Count(fx.queue), "nothing was replayed")
		})
	}
	// A refused payload is refused before any audit record; an edit of a missing id is an
	// action that failed.
	events, err := dlq.ReadAudit(ctx, fx.conn, dlq.AuditQuery{Exchange: o.AuditExchange})
	require.NoError(t, err)
	require.Len(t, events, 2, "the invalid JSON (found only once read) and the missing id")
	for _, ev := range events {
		assert.Equal(t, "failed", ev.Result)
		assert.Zero(t, ev.Count)
	}
	assert.Contains(t, events[0].Error, "not valid JSON")
	assert.Contains(t, events[1].Error, "message not found")
}
