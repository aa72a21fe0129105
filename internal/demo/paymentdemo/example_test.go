package paymentdemo_test

import (
	"fmt"

	"github.com/sluice-go/sluice/internal/demo/paymentdemo"
)

// An end-to-end test publishes each request's Body and checks, per payment ID, that the
// outcome is the expected one under the stack's retry policy (here 3 attempts).
func ExampleMix() {
	count := map[paymentdemo.ExpectedOutcome]int{}
	for _, d := range paymentdemo.Mix(paymentdemo.MixMinimum, 1) {
		count[d.ExpectWithin(3).Outcome]++
	}
	fmt.Println(count)
	// Output:
	// map[dead_lettered:17 duplicate:1 succeeded:4]
}
