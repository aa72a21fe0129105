package panics_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/panics"
)

var errDeclined = errors.New("card declined")

func TestRecoverer(t *testing.T) {
	out := []*message.Message{message.NewMessage("out-1", nil)}
	tests := []struct {
		name      string
		handler   message.HandlerFunc
		wantOut   []*message.Message
		wantErr   error  // for a handler that returns
		wantPanic string // the panic's value as %v, for a handler that panics
	}{
		{
			name:    "a handler that succeeds keeps its output",
			handler: func(*message.Message) ([]*message.Message, error) { return out, nil },
			wantOut: out,
		},
		{
			name:    "a handler that fails keeps its error",
			handler: func(*message.Message) ([]*message.Message, error) { return nil, errDeclined },
			wantErr: errDeclined,
		},
		{
			name:      "a panic is an error with its value and stack",
			handler:   func(*message.Message) ([]*message.Message, error) { panic("ledger is nil") },
			wantPanic: "ledger is nil",
		},
		{
			name: "a runtime error's panic",
			handler: func(*message.Message) ([]*message.Message, error) {
				var ledger map[string]int
				ledger["acct"]++
				return out, nil
			},
			wantPanic: "assignment to entry in nil map",
		},
		{
			name:      "panic(nil) is seen",
			handler:   func(*message.Message) ([]*message.Message, error) { panic(nil) },
			wantPanic: "panic called with nil argument",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := panics.Recoverer(tt.handler)(message.NewMessage("in-1", nil))
			if tt.wantPanic == "" {
				assert.Equal(t, tt.wantOut, got)
				assert.Equal(t, tt.wantErr, err)
				return
			}
			assert.Empty(t, got)
			var p panics.Error
			require.ErrorAs(t, err, &p)
			assert.Contains(t, fmt.Sprint(p.Value), tt.wantPanic)
			assert.Contains(t, p.Stack, "panics_test.TestRecoverer", "the stack holds the panicking frames")
			assert.Contains(t, err.Error(), "panic occurred: ", "the text is Watermill's RecoveredPanicError's")
			assert.Contains(t, err.Error(), ", stacktrace: \n"+p.Stack)
		})
	}
}
