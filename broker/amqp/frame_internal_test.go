package amqp

import (
	"strings"
	"testing"

	"github.com/sluice-go/sluice/internal/headers"
)

// The reserve is a constant so that Marshal does not build a 1 KiB string per publish to
// measure it; it must stay the size of the largest record fit can write.
func TestDroppedReserveIsTheLargestRecord(t *testing.T) {
	if want := 1 + len(headers.Dropped) + fieldSize(strings.Repeat("x", maxDroppedList)); droppedReserve != want {
		t.Fatalf("droppedReserve = %d, want %d", droppedReserve, want)
	}
}
