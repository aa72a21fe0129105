package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sluice-go/sluice/internal/mask"
)

// managementTimeout bounds one call to RabbitMQ's management API.
const managementTimeout = 5 * time.Second

// Discovery: without --queue and RABBITMQ_MANAGEMENT_URL, `sluice console` tries the
// management API where RabbitMQ puts it by default, beside the AMQP listener.
const (
	// DiscoveryPort is the management API's default port.
	DiscoveryPort = "15672"
	// DiscoveryTimeout bounds one discovery attempt: an overview waits no longer for it.
	DiscoveryTimeout = 2 * time.Second
	// defaultDiscoveryRetry is how long a failed discovery is remembered.
	defaultDiscoveryRetry = 30 * time.Second
)

// DiscoveryTarget derives from an AMQP URL where its node's management API would be by
// default: http on DiscoveryPort of the same host, with the AMQP URL's credentials
// (guest:guest, AMQP's default, when it has none), and the URL's virtual host ("/" when
// it names none). amqp://u:p@h:5672/v gives http://u:p@h:15672 and v.
func DiscoveryTarget(amqpURL string) (mgmtURL, vhost string, err error) {
	u, err := url.Parse(strings.TrimSpace(amqpURL))
	if err != nil {
		return "", "", fmt.Errorf("AMQP URL %s does not parse", mask.URL(amqpURL))
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return "", "", fmt.Errorf("AMQP URL %s: scheme %q is not amqp or amqps", mask.URL(amqpURL), u.Scheme)
	}
	if u.Hostname() == "" {
		return "", "", fmt.Errorf("AMQP URL %s names no host", mask.URL(amqpURL))
	}
	user := u.User
	if user == nil {
		user = url.UserPassword("guest", "guest")
	}
	m := url.URL{Scheme: "http", User: user, Host: net.JoinHostPort(u.Hostname(), DiscoveryPort)}
	vhost = "/"
	if u.Path != "" && u.Path != "/" {
		vhost = strings.TrimPrefix(u.Path, "/")
	}
	return m.String(), vhost, nil
}

// discovery remembers a failed discovery, so that it is tried at most once per
// Config.DiscoveryRetry however often the overview is read.
type discovery struct {
	mu       sync.Mutex
	failedAt time.Time
	err      error
}

// discover lists the vhost's queues through Config.DiscoveryURL, or returns the error
// of the last attempt when it failed less than DiscoveryRetry ago. Attempts never
// overlap: a request arriving during one waits for it (at most DiscoveryTimeout) and
// shares its failure.
func (s *Server) discover(ctx context.Context) (map[string]mgmtQueue, error) {
	s.disc.mu.Lock()
	defer s.disc.mu.Unlock()
	if s.disc.err != nil && time.Since(s.disc.failedAt) < s.cfg.DiscoveryRetry {
		return nil, s.disc.err
	}
	byName, err := s.managementQueues(ctx, s.cfg.DiscoveryURL, DiscoveryTimeout)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err // the request went away: not the API's failure
		}
		s.disc.failedAt, s.disc.err = time.Now(), err
		return nil, err
	}
	s.disc.err = nil
	return byName, nil
}

// mgmtQueue is a queue as GET /api/queues/{vhost} lists it.
type mgmtQueue struct {
	Name      string `json:"name"`
	Ready     int    `json:"messages_ready"`
	Unacked   int    `json:"messages_unacknowledged"`
	Consumers int    `json:"consumers"`
}

// managementQueues lists the vhost's queues through the management API at mgmtURL
// (credentials in its userinfo), waiting at most timeout.
func (s *Server) managementQueues(ctx context.Context, mgmtURL string, timeout time.Duration) (map[string]mgmtQueue, error) {
	base, err := url.Parse(mgmtURL)
	if err != nil {
		return nil, fmt.Errorf("management URL %s: %w", mask.URL(mgmtURL), err)
	}
	user := base.User
	base.User = nil
	vhost := s.cfg.VHost
	if vhost == "" {
		vhost = "/"
	}
	u := strings.TrimRight(base.String(), "/") + "/api/queues/" + url.PathEscape(vhost) +
		"?columns=name,messages_ready,messages_unacknowledged,consumers"
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if user != nil {
		pw, _ := user.Password()
		req.SetBasicAuth(user.Username(), pw)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("management API at %s: %w", base.Redacted(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("management API at %s: GET /api/queues: %s", base.Redacted(), resp.Status)
	}
	var list []mgmtQueue
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("management API at %s: decode the queue list: %w", base.Redacted(), err)
	}
	byName := make(map[string]mgmtQueue, len(list))
	for _, q := range list {
		byName[q.Name] = q
	}
	return byName, nil
}

// sluiceQueues returns the queues of byName that use sluice's topology: those with a
// Q.dlq beside them.
func sluiceQueues(byName map[string]mgmtQueue, dlqName func(string) string) []string {
	var out []string
	for name := range byName {
		if _, ok := byName[dlqName(name)]; ok {
			out = append(out, name)
		}
	}
	return out
}
