//go:build soak

package soak

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The series the soak samples, in the table's order.
const (
	seriesRSS         = "RSS"
	seriesHeap        = "Go heap in use"
	seriesGoroutines  = "goroutines"
	seriesConnections = "AMQP connections"
	seriesChannels    = "AMQP channels"
)

// reading is one round of samples; a series missing from it could not be read this round.
type reading map[string]float64

// sampler reads the service's figures: RSS from /proc, heap and goroutines from its
// /metrics (the Go collector otelsetup registers), its AMQP connections from its own
// sockets (so they count whatever the broker reports), and their channels from the broker.
type sampler struct {
	pid         int
	metricsURL  string
	brokerPort  int
	channels    channelSource
	http        *http.Client
	lastMetrics string
}

// read takes one round. A figure that cannot be read is left out of the reading and its
// error joined to the one returned, so that one slow answer costs one sample, not the
// round.
func (s *sampler) read(ctx context.Context) (reading, error) {
	r := reading{}
	var errs []error
	if rss, err := rssBytes(s.pid); err != nil {
		errs = append(errs, err)
	} else {
		r[seriesRSS] = rss
	}
	if text, err := s.scrape(ctx); err != nil {
		errs = append(errs, err)
	} else {
		for series, metric := range map[string]string{seriesHeap: "go_memstats_heap_inuse_bytes", seriesGoroutines: "go_goroutines"} {
			if v, ok := metricSum(text, metric); ok {
				r[series] = v
			} else {
				errs = append(errs, fmt.Errorf("metric %s missing from %s", metric, s.metricsURL))
			}
		}
	}
	ports, err := brokerSockets(s.pid, s.brokerPort)
	if err != nil {
		return r, errors.Join(append(errs, err)...)
	}
	r[seriesConnections] = float64(len(ports))
	if s.channels != nil {
		if n, err := s.channels.count(ctx, ports); err != nil {
			errs = append(errs, err)
		} else {
			r[seriesChannels] = float64(n)
		}
	}
	return r, errors.Join(errs...)
}

// scrape returns the service's /metrics text.
func (s *sampler) scrape(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.metricsURL, nil)
	if err != nil {
		return "", fmt.Errorf("metrics request %s: %w", s.metricsURL, err)
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("scrape %s: %w", s.metricsURL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("scrape %s: status %d, %v", s.metricsURL, resp.StatusCode, err)
	}
	s.lastMetrics = string(b)
	return s.lastMetrics, nil
}

// rssBytes returns the resident set of process pid (VmRSS).
func rssBytes(pid int) (float64, error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("%s: VmRSS line %q is not '<n> kB'", path, line)
			}
			kb, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				return 0, fmt.Errorf("%s: VmRSS %q: %w", path, f[0], err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in %s", path)
}

// metricSum sums every sample of the Prometheus metric name in text (all label sets); ok
// is false when there is none.
func metricSum(text, name string) (sum float64, ok bool) {
	for _, line := range strings.Split(text, "\n") {
		rest, found := strings.CutPrefix(line, name)
		if !found || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		if rest[0] == '{' {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				continue
			}
			rest = rest[end+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		sum += v
		ok = true
	}
	return sum, ok
}

// brokerSockets returns the local ports of process pid's established TCP connections to
// brokerPort: its AMQP connections, as the process holds them. The broker names a
// connection by this port (peer_port), which is how channels are matched to the service.
func brokerSockets(pid, brokerPort int) ([]int, error) {
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", fdDir, err)
	}
	inodes := map[string]bool{}
	for _, e := range entries {
		link, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil {
			continue // closed since the listing
		}
		if ino, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	var ports []int
	for _, table := range []string{"tcp", "tcp6"} {
		path := fmt.Sprintf("/proc/%d/net/%s", pid, table)
		f, err := os.Open(path)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // no IPv6 here
			}
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "01" || !inodes[fields[9]] {
				continue
			}
			if hexPort(fields[2]) != brokerPort {
				continue
			}
			ports = append(ports, hexPort(fields[1]))
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
	}
	return ports, nil
}

// hexPort returns the port of a /proc/net/tcp address such as 0100007F:1628, or -1.
func hexPort(addr string) int {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return -1
	}
	p, err := strconv.ParseUint(addr[i+1:], 16, 16)
	if err != nil {
		return -1
	}
	return int(p)
}

// channelSource counts the channels the broker has open on the connections whose client
// ports are ports.
type channelSource interface {
	count(ctx context.Context, ports []int) (int, error)
	String() string
}

// findChannelSource returns the first way to count channels that answers: the management
// API (RABBITMQ_MANAGEMENT_URL, else port 15672 on the broker's host with the AMQP URL's
// credentials), then rabbitmqctl when the broker is on this machine. nil and the reasons
// when neither does.
func findChannelSource(ctx context.Context, amqpURL string) (channelSource, error) {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return nil, fmt.Errorf("parse AMQP URL: %w", err)
	}
	base := os.Getenv("RABBITMQ_MANAGEMENT_URL")
	if base == "" {
		m := url.URL{Scheme: "http", User: u.User, Host: net.JoinHostPort(u.Hostname(), "15672")}
		if m.User == nil {
			m.User = url.UserPassword("guest", "guest")
		}
		base = m.String()
	}
	mgmt := &managementChannels{base: strings.TrimSuffix(base, "/"), http: &http.Client{Timeout: 5 * time.Second}}
	_, mErr := mgmt.count(ctx, nil)
	if mErr == nil {
		return mgmt, nil
	}
	host := u.Hostname()
	if host != "127.0.0.1" && host != "localhost" && host != "::1" {
		return nil, fmt.Errorf("management API: %v; rabbitmqctl: broker %s is not on this machine", mErr, host)
	}
	ctl := ctlChannels{}
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		return nil, fmt.Errorf("management API: %v; rabbitmqctl: %v", mErr, err)
	}
	if _, err := ctl.count(ctx, nil); err != nil {
		return nil, fmt.Errorf("management API: %v; %v", mErr, err)
	}
	return ctl, nil
}

// managementChannels counts channels through the management API's connection list.
type managementChannels struct {
	base string
	http *http.Client
}

func (m *managementChannels) String() string { return "the management API" }

func (m *managementChannels) count(ctx context.Context, ports []int) (int, error) {
	u, err := url.Parse(m.base + "/api/connections?columns=peer_port,channels")
	if err != nil {
		return 0, fmt.Errorf("management URL: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, err
	}
	if u.User != nil {
		pw, _ := u.User.Password()
		req.SetBasicAuth(u.User.Username(), pw)
	}
	resp, err := m.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("list connections at %s:%s: %w", u.Hostname(), u.Port(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("list connections at %s:%s: status %d", u.Hostname(), u.Port(), resp.StatusCode)
	}
	var conns []struct {
		PeerPort int `json:"peer_port"`
		Channels int `json:"channels"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&conns); err != nil {
		return 0, fmt.Errorf("decode connections from %s:%s: %w", u.Hostname(), u.Port(), err)
	}
	byPort := map[int]int{}
	for _, c := range conns {
		byPort[c.PeerPort] = c.Channels
	}
	return sumPorts(byPort, ports)
}

// ctlChannels counts channels with rabbitmqctl on the broker's machine, for a node without
// the management plugin (the machine's 3.10: enabling a plugin on a shared node is not
// the soak's to do).
type ctlChannels struct{}

func (ctlChannels) String() string { return "rabbitmqctl list_connections" }

func (ctlChannels) count(ctx context.Context, ports []int) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "list_connections", "peer_port", "channels", "--quiet", "--no-table-headers").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("rabbitmqctl list_connections peer_port channels: %v: %s", err, strings.TrimSpace(string(out)))
	}
	byPort := map[int]int{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		p, err1 := strconv.Atoi(f[0])
		n, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			return 0, fmt.Errorf("rabbitmqctl list_connections: line %q is not '<peer_port> <channels>'", line)
		}
		byPort[p] = n
	}
	return sumPorts(byPort, ports)
}

// sumPorts adds up the channels of the connections on ports. When the broker knows none
// of them it was asked about another node than the service's (rabbitmqctl reaches the
// machine's default node, whatever AMQP_URL says): an error, not a silent zero.
func sumPorts(byPort map[int]int, ports []int) (int, error) {
	n, known := 0, 0
	for _, p := range ports {
		if c, ok := byPort[p]; ok {
			n += c
			known++
		}
	}
	if len(ports) > 0 && known == 0 {
		return 0, fmt.Errorf("the broker lists none of the service's connections (client ports %v) among its %d: another node answered", ports, len(byPort))
	}
	return n, nil
}
