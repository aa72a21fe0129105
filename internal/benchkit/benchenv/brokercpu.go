package benchenv

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// BrokerCPU returns a function reading the CPU time, user and system, of the process
// listening on url's port (the broker); it reads 0 when that process cannot be found or
// read (another user's, another machine's). Take it before and after a measurement.
func BrokerCPU(url string) func() time.Duration {
	pid := brokerPID(url)
	return func() time.Duration { return processCPU(pid) }
}

// brokerPID returns the process listening on url's port, or 0.
func brokerPID(url string) int {
	u, err := amqp091.ParseURI(url)
	if err != nil {
		return 0
	}
	out, err := exec.Command("ss", "-Htlnp", "sport = :"+strconv.Itoa(u.Port)).Output()
	if err != nil {
		return 0
	}
	m := regexp.MustCompile(`pid=(\d+)`).FindSubmatch(out)
	if m == nil {
		return 0
	}
	pid, _ := strconv.Atoi(string(m[1]))
	return pid
}

// processCPU returns the user and system CPU time pid has used (0 when unknown).
func processCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the command name, which may hold spaces: state is the first.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks
}
