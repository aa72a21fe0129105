package breaker_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The package promises to start no goroutine; any left behind by a test is a bug.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
