package idempotency_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/middleware/idempotency"
)

// decodeErr is a handler's decode failure naming its own type, as example_payment's does.
type decodeErr struct{ err error }

func (e *decodeErr) Error() string     { return "decode payment request: " + e.err.Error() }
func (e *decodeErr) Unwrap() error     { return e.err }
func (e *decodeErr) ErrorType() string { return "decode" }

// Issue 17: a payload that did not decode was dead-lettered as "permanent: idempotency:
// cannot derive key of message m-1: permanent: decode ...".
func TestMiddleware_KeyErrorReadsAsItsCause(t *testing.T) {
	var v map[string]any
	syntaxErr := json.Unmarshal([]byte("{broken"), &v)
	require.Error(t, syntaxErr)
	tests := []struct {
		name       string
		keyErr     error
		wantPrefix string
		wantType   string
	}{
		{"permanent typed decode failure", sluice.Permanent(&decodeErr{syntaxErr}), "permanent: decode payment request: invalid character", "decode"},
		{"raw decoder error", fmt.Errorf("payment id: %w", syntaxErr), "permanent: payment id: invalid character", "json.SyntaxError"},
		{"error with nothing to name", errors.New("no payment_id"), "permanent: no payment_id", idempotency.ErrorTypeKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGuard(t, idempotency.Config{KeyFunc: func(*message.Message) (string, error) { return "", tt.keyErr }})
			h := g.NewMiddleware(nil)(func(*message.Message) ([]*message.Message, error) { return nil, nil })
			_, err := h(message.NewMessage("m-1", []byte("{broken")))
			require.Error(t, err)
			assert.Equal(t, sluice.ClassPermanent, sluice.ClassOf(err))
			assert.ErrorIs(t, err, idempotency.ErrKey)
			assert.True(t, strings.HasPrefix(err.Error(), tt.wantPrefix), "%q starts with %q", err.Error(), tt.wantPrefix)
			assert.Contains(t, err.Error(), "m-1")
			assert.Equal(t, 1, strings.Count(err.Error(), "permanent"), err.Error())
			assert.Equal(t, tt.wantType, sluice.ErrorType(err))
		})
	}
}
