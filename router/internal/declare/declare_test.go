package declare_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/broker"
	"github.com/sluice-go/sluice/router/internal/declare"
)

// recorder is a broker that records each declaration it is asked for, and refuses the one
// named fail.
type recorder struct {
	broker.Broker // nil: only the declarations are called
	calls         []string
	fail          string
}

func (r *recorder) do(call string) error {
	r.calls = append(r.calls, call)
	if call == r.fail {
		return errors.New("refused")
	}
	return nil
}

func (r *recorder) DeclareQueue(_ context.Context, q string) error { return r.do("queue " + q) }
func (r *recorder) DeclareOutputQueue(_ context.Context, q string) error {
	return r.do("output " + q)
}
func (r *recorder) DeclarePartitioned(_ context.Context, q string, n int) error {
	return r.do(fmt.Sprintf("partitioned %s %d", q, n))
}
func (r *recorder) DeclareSubscription(_ context.Context, q string, bs []broker.Binding, adopt bool) error {
	return r.do(fmt.Sprintf("subscription %s %d %t", q, len(bs), adopt))
}
func (r *recorder) DeclareExchange(_ context.Context, ex string, kind broker.ExchangeKind, adopt bool) error {
	return r.do(fmt.Sprintf("exchange %s %s %t", ex, kind, adopt))
}

func TestPlan_Declare(t *testing.T) {
	build := func() *declare.Plan {
		var p declare.Plan
		p.Queue("in")
		p.Output("out") // consumed nowhere here: no failure paths of its own
		p.Output("in")  // consumed here too: declared with them
		p.Output("sub") // a subscriber's queue: declared with them
		p.Partitioned("pq", 2)
		p.Subscription("sub", []broker.Binding{{Exchange: "orders"}}, true)
		p.OutputExchange("events", broker.Fanout, false)
		return &p
	}
	tests := []struct {
		name    string
		fail    string
		want    []string
		wantErr string
	}{
		{
			name: "everything in order",
			want: []string{"queue in", "output out", "queue in", "queue sub", "partitioned pq 2", "subscription sub 1 true", "exchange events fanout false"},
		},
		{
			name:    "a refusal stops the declaration and names what failed",
			fail:    "partitioned pq 2",
			want:    []string{"queue in", "output out", "queue in", "queue sub", "partitioned pq 2"},
			wantErr: `declare queue "pq" as 2 partitions: refused`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{fail: tt.fail}
			err := build().Copy().Declare(context.Background(), r)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tt.want, r.calls)
		})
	}
}

func TestPlan_Consumed(t *testing.T) {
	p := build2()
	assert.Equal(t, []string{"a", "pq.p0", "pq.p1", "sub"}, p.Consumed(), "each consumed queue once, partitions by name, outputs not")
}

func TestPlan_DeadLettered(t *testing.T) {
	p := build2()
	assert.Equal(t, []string{"a", "pq", "sub"}, p.DeadLettered(), "a partitioned queue's partitions dead-letter to its own DLQ")
}

func build2() *declare.Plan {
	var p declare.Plan
	p.Queue("sub")
	p.Queue("a")
	p.Output("out")
	p.Partitioned("pq", 2)
	p.Subscription("sub", nil, false)
	return &p
}
