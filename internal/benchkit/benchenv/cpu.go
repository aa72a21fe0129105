package benchenv

import (
	"syscall"
	"time"
)

// CPUTime returns the CPU time the process has used so far, user and system, every
// goroutine included (the garbage collector, an exporter's, the broker client's). On a
// machine whose cores other processes share, a benchmark's CPU time per operation moves
// far less with their load than its wall time does.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
