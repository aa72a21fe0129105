package test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/outboxstore"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/testkit/testenv"
	"github.com/sluice-go/sluice/internal/topology"
)

// The demo's producer publishes through the outbox (PAYMENTS_OUTBOX_DIR) and a failover
// publisher (AMQP_SECONDARY_URL; here the same node, the outage tests are in outbox/ and
// failover/): the mix settles as without them, and the outbox file is left empty.
func TestPaymentsDemoThroughTheOutbox(t *testing.T) {
	bin := testenv.Binary(t, "./cmd/payments")
	r := testenv.NewRabbit(t)
	queue, output := testenv.Name("demo.outbox.requested"), testenv.Name("demo.outbox.succeeded")
	r.DeleteQueues(queue, topology.DLQ(queue), output, topology.DLQ(output))
	dir := t.TempDir()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "demo", "-n", "80", "-seed", "7")
	cmd.Env = append(fastPaymentsEnv(r.URL, queue, output), "PAYMENTS_OUTBOX_DIR="+dir, "AMQP_SECONDARY_URL="+r.URL)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "demo failed:\n%s", out)
	require.Contains(t, string(out), "every request settled as the contract says")

	_, err = os.Stat(filepath.Join(dir, outboxstore.FileName))
	require.NoError(t, err, "the producer opened its outbox")
	s, err := outboxstore.OpenStore(dir, 1, 1)
	require.NoError(t, err)
	defer s.Close()
	n, _ := s.Len()
	require.Zero(t, n, "entries left in the outbox")
}
